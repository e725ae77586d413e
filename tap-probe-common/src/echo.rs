//! How a message quotes what it was given: whole when it is short, else its beginning and
//! how long the whole is. A name of a megabyte, or a line of one, then costs a message a
//! line, not a megabyte, wherever it is echoed (a spec, a baseline, a duration, a synthetic
//! workload).

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::String;

/// The most characters of a value a message quotes; longer ones are cut.
pub const MAX_CHARS: usize = 80;

/// `text` cut to `max` characters, with an ellipsis and the whole's length in characters
/// after a cut: `aaaa… (1048576 characters)`.
#[must_use]
pub fn clipped(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!(
            "{}… ({} characters)",
            &text[..end],
            text.chars().count()
        )),
    }
}

/// `text` in double quotes with Rust's escapes (as `{:?}` shows it), cut to `max`
/// characters: `"aaaa…" (1048576 characters)`.
#[must_use]
pub fn quoted(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}… ({} characters)", &text[..end], text.chars().count()),
    }
}

/// A reader's own message (TOML's, JSON's), which quotes what it read, cut to a line:
/// every part of it between quotes (`` ` `` or `"`), and between those, cut to
/// [`MAX_CHARS`]. Its own words are shorter than that; what it quotes may not be.
#[must_use]
pub fn clip_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(8 * MAX_CHARS));
    let mut rest = message;
    while let Some(at) = rest.find(['`', '"']) {
        out.push_str(&clipped(&rest[..at], MAX_CHARS));
        out.push_str(&rest[at..=at]);
        rest = &rest[at + 1..];
    }
    out.push_str(&clipped(rest, MAX_CHARS));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_quoted_whole() {
        assert_eq!(clipped("stock", 10), "stock");
        assert_eq!(quoted("a \"b\"", 10), r#""a \"b\"""#);
        assert_eq!(quoted("0123456789", 10), "\"0123456789\"");
    }

    #[test]
    fn long_text_is_cut_and_its_length_said() {
        let long = "é".repeat(1_000_000);
        assert_eq!(clipped(&long, 3), "ééé… (1000000 characters)".to_owned());
        assert_eq!(quoted(&long, 2), "\"éé\"… (1000000 characters)");
        assert!(quoted(&long, MAX_CHARS).len() < 3 * MAX_CHARS);
    }

    #[test]
    fn quoted_parts_of_a_readers_message_are_cut() {
        let key = "k".repeat(500);
        let message = format!("unknown field `{key}`, expected one of `name`, `qdisc`");
        let clipped = clip_quoted(&message);
        assert!(clipped.len() < 200, "{clipped}");
        assert!(clipped.contains("(500 characters)`, expected one of `name`, `qdisc`"));
        let message = format!("invalid type: string \"{key}\", expected u64 at line 1 column 9");
        assert_eq!(
            clip_quoted(&message),
            format!(
                "invalid type: string \"{}… (500 characters)\", expected u64 at line 1 column 9",
                &key[..MAX_CHARS]
            )
        );
        assert_eq!(clip_quoted("no quotes"), "no quotes");
        assert_eq!(clip_quoted("open `end"), "open `end");
    }
}
