//! What a terminal sends for a key, as key presses: printable characters, Enter, Escape,
//! control keys, and the escape sequences of the arrows, Home, End, `PgUp` and `PgDn` in the
//! forms terminals send them (`ESC [ A`, `ESC O A`, `ESC [ 5 ~`, with modifiers as
//! `ESC [ 1 ; 5 A`). Sequences the view has no use for are skipped whole.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// ESC, which starts every sequence.
const ESC: u8 = 0x1b;
/// A sequence longer than this is not one the view knows: dropped.
const LONGEST: usize = 32;

/// Bytes from the terminal to key presses. A sequence cut between two reads is kept for the
/// next; a lone ESC at the end of a read is the Escape key, since a terminal sends a whole
/// sequence at once.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    pending: Vec<u8>,
}

/// One step of decoding.
enum Step {
    /// A key (or none, for a byte or sequence the view does not use) and the bytes it took.
    Took(Option<KeyEvent>, usize),
    /// The bytes end inside a sequence.
    Incomplete,
}

impl Keys {
    /// The keys in `bytes`, the next bytes read from the terminal.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<KeyEvent> {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(bytes);
        let mut keys = Vec::new();
        let mut at = 0;
        while at < buf.len() {
            match step(&buf[at..]) {
                Step::Took(key, n) => {
                    keys.extend(key);
                    at += n;
                }
                Step::Incomplete => {
                    if buf.len() - at <= LONGEST {
                        self.pending = buf[at..].to_vec();
                    }
                    break;
                }
            }
        }
        keys
    }
}

/// `code`, unmodified, taking `n` bytes.
fn took(code: KeyCode, n: usize) -> Step {
    Step::Took(Some(KeyEvent::new(code, KeyModifiers::NONE)), n)
}

/// The first key of `bytes` (not empty).
fn step(bytes: &[u8]) -> Step {
    match bytes[0] {
        ESC => escape(bytes),
        b'\r' | b'\n' => took(KeyCode::Enter, 1),
        b'\t' => took(KeyCode::Tab, 1),
        0x7f | 0x08 => took(KeyCode::Backspace, 1),
        // Ctrl-A to Ctrl-Z (raw mode passes them on as bytes: Ctrl-C is 0x03, not SIGINT).
        b @ 0x01..=0x1a => Step::Took(
            Some(KeyEvent::new(
                KeyCode::Char(char::from(b - 1 + b'a')),
                KeyModifiers::CONTROL,
            )),
            1,
        ),
        b @ 0x20..=0x7e => took(KeyCode::Char(char::from(b)), 1),
        b if b >= 0xc0 => utf8(bytes),
        // Other control bytes, a stray continuation byte.
        _ => Step::Took(None, 1),
    }
}

/// A character of several UTF-8 bytes.
fn utf8(bytes: &[u8]) -> Step {
    let len = match bytes[0] {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    if bytes.len() < len {
        return Step::Incomplete;
    }
    match std::str::from_utf8(&bytes[..len])
        .ok()
        .and_then(|s| s.chars().next())
    {
        Some(c) => took(KeyCode::Char(c), len),
        None => Step::Took(None, 1),
    }
}

/// ESC alone (Escape), ESC ESC, ESC [ ... (CSI), ESC O x (SS3), or ESC and a key (Alt).
fn escape(bytes: &[u8]) -> Step {
    match bytes.get(1) {
        None | Some(&ESC) => took(KeyCode::Esc, 1),
        Some(b'[') => csi(bytes),
        Some(b'O') => match bytes.get(2) {
            None => Step::Incomplete,
            Some(&last) => sequence(final_key(last, &[]), 3),
        },
        Some(_) => match step(&bytes[1..]) {
            Step::Took(key, n) => {
                Step::Took(key.map(|k| KeyEvent::new(k.code, KeyModifiers::ALT)), n + 1)
            }
            Step::Incomplete => Step::Incomplete,
        },
    }
}

/// `ESC [ params intermediates final`: parameter bytes 0x30-0x3f, intermediate bytes
/// 0x20-0x2f, a final byte 0x40-0x7e (ECMA-48 5.4).
fn csi(bytes: &[u8]) -> Step {
    let body = &bytes[2..];
    let Some(end) = body.iter().position(|b| (0x40..=0x7e).contains(b)) else {
        return Step::Incomplete;
    };
    if body[..end].iter().any(|b| !(0x20..=0x3f).contains(b)) {
        // Not a sequence after all: Escape, and the rest as keys of their own.
        return took(KeyCode::Esc, 1);
    }
    let params: Vec<u32> = std::str::from_utf8(&body[..end])
        .unwrap_or_default()
        .split(';')
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    sequence(final_key(body[end], &params), 2 + end + 1)
}

/// A sequence of `n` bytes, with its key if the view knows it.
fn sequence(code: Option<KeyCode>, n: usize) -> Step {
    match code {
        Some(code) => took(code, n),
        None => Step::Took(None, n),
    }
}

/// The key of a sequence's final byte; modifiers (`1;5`) are not told apart.
fn final_key(last: u8, params: &[u32]) -> Option<KeyCode> {
    Some(match last {
        b'A' => KeyCode::Up,
        b'B' => KeyCode::Down,
        b'C' => KeyCode::Right,
        b'D' => KeyCode::Left,
        b'H' => KeyCode::Home,
        b'F' => KeyCode::End,
        b'~' => match params.first() {
            Some(1 | 7) => KeyCode::Home,
            Some(4 | 8) => KeyCode::End,
            Some(5) => KeyCode::PageUp,
            Some(6) => KeyCode::PageDown,
            _ => return None,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(keys: &mut Keys, bytes: &[u8]) -> Vec<KeyCode> {
        keys.feed(bytes).into_iter().map(|k| k.code).collect()
    }

    #[test]
    fn keys_and_sequences_in_every_form_terminals_send() {
        use KeyCode::{Char, Down, End, Enter, Esc, Home, Left, PageDown, PageUp, Right, Up};
        let mut keys = Keys::default();
        assert_eq!(
            codes(&mut keys, b"qjk?sSrd"),
            "qjk?sSrd".chars().map(Char).collect::<Vec<_>>()
        );
        assert_eq!(codes(&mut keys, b"\r\n"), [Enter, Enter]);
        assert_eq!(
            codes(&mut keys, b"\x1b[A\x1b[B\x1b[C\x1b[D"),
            [Up, Down, Right, Left]
        );
        assert_eq!(
            codes(&mut keys, b"\x1bOA\x1bOB\x1bOH\x1bOF"),
            [Up, Down, Home, End]
        );
        assert_eq!(codes(&mut keys, b"\x1b[5~\x1b[6~"), [PageUp, PageDown]);
        assert_eq!(
            codes(&mut keys, b"\x1b[H\x1b[F\x1b[1~\x1b[4~\x1b[7~\x1b[8~"),
            [Home, End, Home, End, Home, End]
        );
        // Modifiers are taken as the plain key; unknown sequences are skipped whole.
        assert_eq!(
            codes(&mut keys, b"\x1b[1;5A\x1b[15~\x1b[?1;2cq"),
            [Up, Char('q')]
        );
        assert_eq!(codes(&mut keys, b"\x1b"), [Esc]);
        assert_eq!(codes(&mut keys, b"\x1b\x1b"), [Esc, Esc]);
        assert_eq!(codes(&mut keys, "é".as_bytes()), [Char('é')]);
    }

    #[test]
    fn control_keys_carry_the_control_modifier() {
        let mut keys = Keys::default();
        let ctrl_c = keys.feed(b"\x03");
        assert_eq!(ctrl_c[0].code, KeyCode::Char('c'));
        assert!(ctrl_c[0].modifiers.contains(KeyModifiers::CONTROL));
        let alt_q = keys.feed(b"\x1bq");
        assert_eq!(alt_q[0].code, KeyCode::Char('q'));
        assert!(alt_q[0].modifiers.contains(KeyModifiers::ALT));
    }

    #[test]
    fn a_sequence_cut_between_reads_is_completed_by_the_next() {
        let mut keys = Keys::default();
        assert!(
            keys.feed(b"j\x1b[")
                .iter()
                .all(|k| k.code == KeyCode::Char('j'))
        );
        assert_eq!(codes(&mut keys, b"6~"), [KeyCode::PageDown]);
        assert!(keys.feed(b"\x1bO").is_empty());
        assert_eq!(codes(&mut keys, b"B"), [KeyCode::Down]);
        assert!(keys.feed(&"é".as_bytes()[..1]).is_empty());
        assert_eq!(codes(&mut keys, &"é".as_bytes()[1..]), [KeyCode::Char('é')]);
        // Garbage that never ends is dropped rather than kept.
        assert!(
            keys.feed(&[b"\x1b[".as_slice(), &[b'1'; 40]].concat())
                .is_empty()
        );
        assert_eq!(codes(&mut keys, b"q"), [KeyCode::Char('q')]);
    }
}
