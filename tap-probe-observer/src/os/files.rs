//! Files named on the command line. An input is read whole only when it is a file or a
//! pipe, and only up to a bound: `/dev/zero`, a terminal or a file of gigabytes is refused
//! before a byte of it is held. An output is checked before a run makes anything (a
//! namespace, a tap, a probe), so that a path that cannot be written costs nothing but a
//! line. Either refusal is [`Unusable`]: a problem of the command line, which exits with
//! status 2, as one clap refuses does.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// A file named on the command line that cannot be used, and why, in one line.
#[derive(Debug)]
pub struct Unusable(String);

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unusable {}

/// What a path is, for a message that refuses it.
fn kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_fifo() {
        "a pipe"
    } else {
        "a file"
    }
}

/// Whether an input of this type is read: a regular file, or a pipe (`<(...)`,
/// `/dev/stdin` from a shell's pipe), whose end is the writer's.
fn readable(file_type: std::fs::FileType) -> bool {
    file_type.is_file() || file_type.is_fifo()
}

/// A size for a message: whole MiB as such (the bounds), anything else in bytes, which
/// tells 16 MiB and one byte from 16 MiB.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        return format!("{} MiB", bytes >> 20);
    }
    format!("{bytes} bytes")
}

/// Reads the input `what` (`the spec`, `--baseline`) at `path` whole, as UTF-8 text, if it
/// is a file or a pipe of at most `max_bytes`; `hint` says what to give instead.
///
/// # Errors
/// When it cannot be opened, is something else (a directory, a device, a socket), holds
/// more than `max_bytes` (a file is refused by its size, before it is read) or is not UTF-8.
pub fn read_input(path: &Path, what: &str, max_bytes: u64, hint: &str) -> Result<String, Unusable> {
    let shown = path.display();
    let refuse = |why: String| Unusable(format!("{what} {shown} {why}; {hint}"));
    // Looked at before it is opened: opening a device can do something (a tape rewinds, a
    // watchdog starts); a pipe's open waits for its writer, as it should.
    let meta = std::fs::metadata(path).map_err(|err| refuse(format!("cannot be read: {err}")))?;
    if !readable(meta.file_type()) {
        return Err(refuse(format!(
            "is {}, not a file or a pipe",
            kind(meta.file_type())
        )));
    }
    let file = File::open(path).map_err(|err| refuse(format!("cannot be read: {err}")))?;
    let meta = file
        .metadata()
        .map_err(|err| refuse(format!("cannot be read: {err}")))?;
    if !readable(meta.file_type()) {
        return Err(refuse(format!(
            "is {}, not a file or a pipe",
            kind(meta.file_type())
        )));
    }
    let too_large = || {
        refuse(format!(
            "is larger than {}, the most tap-probe reads of it",
            size(max_bytes)
        ))
    };
    if meta.len() > max_bytes {
        return Err(refuse(format!(
            "is {}, more than {}, the most tap-probe reads of it",
            size(meta.len()),
            size(max_bytes)
        )));
    }
    // A pipe has no size, and a file may grow: read one byte past the bound at most.
    let mut bytes = Vec::new();
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| refuse(format!("cannot be read: {err}")))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|err| {
        refuse(format!(
            "is not UTF-8 text (byte {} is not)",
            err.utf8_error().valid_up_to()
        ))
    })
}

/// Checks that the output `what` (`--junit`, `-o`) can be written at `path`, changing
/// nothing: an existing file is opened for writing and closed as it was; a missing one is
/// created and removed again, which tells that its directory exists and takes it. A pipe
/// or a device (`/dev/stdout`, `/dev/null`) is taken as it is; whether it takes all that is
/// written (`/dev/full` does not) only the writing tells.
///
/// # Errors
/// When `path` is a directory, or cannot be opened or created for writing.
pub fn check_output(path: &Path, what: &str) -> Result<(), Unusable> {
    let shown = path.display();
    let refuse = |why: String| Unusable(format!("{what} {shown} {why}"));
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(refuse(
            "is a directory; name a file (in it, or elsewhere)".to_owned(),
        )),
        Ok(meta) => {
            // Without O_TRUNC nothing changes; O_NONBLOCK, so that a pipe without a reader
            // yet does not hold the check (its open fails with ENXIO then, which is fine).
            match OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
            {
                Ok(_) => Ok(()),
                Err(err)
                    if meta.file_type().is_fifo() && err.raw_os_error() == Some(libc::ENXIO) =>
                {
                    Ok(())
                }
                Err(err) => Err(refuse(format!("cannot be written: {err}"))),
            }
        }
        Err(err) if err.kind() == ErrorKind::NotFound => {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|err| refuse(format!("cannot be created: {err}{}", missing_dir(path))))?;
            std::fs::remove_file(path)
                .map_err(|err| refuse(format!("was created but cannot be removed: {err}")))
        }
        Err(err) => Err(refuse(format!("cannot be written: {err}"))),
    }
}

/// Checks that the output directory `what` (`vm --out`) can be written at `path`, changing
/// nothing: an existing one takes a file (created and removed again), a missing one's
/// nearest existing ancestor takes a directory (made and removed again).
///
/// # Errors
/// When `path` is not a directory, or it or what it would be made in cannot be written.
pub fn check_output_dir(path: &Path, what: &str) -> Result<(), Unusable> {
    let shown = path.display();
    let refuse = |why: String| Unusable(format!("{what} {shown} {why}"));
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            let probe = path.join(format!(".tap-probe-check-{}", std::process::id()));
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&probe)
                .map_err(|err| refuse(format!("cannot be written: {err}")))?;
            std::fs::remove_file(&probe).map_err(|err| refuse(format!("cannot be written: {err}")))
        }
        Ok(meta) => Err(refuse(format!(
            "is {}, not a directory",
            kind(meta.file_type())
        ))),
        Err(err) if err.kind() == ErrorKind::NotFound => {
            let first = first_missing(path);
            std::fs::create_dir(&first)
                .map_err(|err| refuse(format!("cannot be made: {err}{}", missing_dir(&first))))?;
            std::fs::remove_dir(&first)
                .map_err(|err| refuse(format!("was made but cannot be removed: {err}")))
        }
        Err(err) => Err(refuse(format!("cannot be written: {err}"))),
    }
}

/// The outermost directory of `path` that does not exist yet (`path` itself when its parent
/// does).
fn first_missing(path: &Path) -> PathBuf {
    let mut first = path.to_path_buf();
    while let Some(parent) = first.parent() {
        if parent.as_os_str().is_empty() || parent.exists() {
            break;
        }
        first = parent.to_path_buf();
    }
    first
}

/// What to add to "cannot be created" when the directory it would be in is missing.
fn missing_dir(path: &Path) -> String {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.exists() => {
            format!(" (the directory {} does not exist)", dir.display())
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path, max: u64) -> Result<String, String> {
        read_input(path, "the spec", max, "give the scenario file").map_err(|e| e.to_string())
    }

    #[test]
    fn inputs_are_files_or_pipes_within_their_bound() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lab.toml");
        std::fs::write(&file, "[[scenario]]\n").unwrap();
        assert_eq!(read(&file, 100).unwrap(), "[[scenario]]\n");
        let err = read(&file, 5).unwrap_err();
        assert!(
            err.contains("lab.toml is 13 bytes, more than 5 bytes")
                && err.ends_with("; give the scenario file"),
            "{err}"
        );
        let err = read(Path::new("/dev/zero"), 100).unwrap_err();
        assert_eq!(
            err,
            "the spec /dev/zero is a character device, not a file or a pipe; give the scenario \
             file"
        );
        let err = read(dir.path(), 100).unwrap_err();
        assert!(
            err.contains("is a directory, not a file or a pipe"),
            "{err}"
        );
        let err = read(&dir.path().join("missing.toml"), 100).unwrap_err();
        assert!(
            err.contains("missing.toml cannot be read: No such file"),
            "{err}"
        );
        std::fs::write(&file, b"name = \"\xff\"").unwrap();
        let err = read(&file, 100).unwrap_err();
        assert!(err.contains("is not UTF-8 text (byte 8 is not)"), "{err}");
    }

    #[test]
    fn a_pipe_is_read_up_to_its_bound() {
        let (reader, writer) = std::io::pipe().unwrap();
        let feeder = std::thread::spawn(move || {
            let mut writer = writer;
            // Ends with EPIPE once the reader has had its fill and gone.
            let _ = std::io::Write::write_all(&mut writer, &vec![b'#'; 1 << 20]);
        });
        let path = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&reader)
        ));
        let err = read(&path, 1000).unwrap_err();
        assert!(err.contains("is larger than 1000 bytes"), "{err}");
        drop(reader);
        feeder.join().unwrap();
    }

    #[test]
    fn outputs_are_checked_without_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("junit.xml");
        check_output(&new, "--junit").unwrap();
        assert!(!new.exists(), "the check leaves no file");
        std::fs::write(&new, "kept").unwrap();
        check_output(&new, "--junit").unwrap();
        assert_eq!(std::fs::read_to_string(&new).unwrap(), "kept");
        check_output(Path::new("/dev/null"), "--junit").unwrap();
        let err = check_output(&dir.path().join("no/such/junit.xml"), "--junit")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot be created: No such file or directory")
                && err.contains("(the directory ")
                && err.ends_with("/no/such does not exist)"),
            "{err}"
        );
        let err = check_output(dir.path(), "--junit").unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn output_directories_are_checked_without_a_trace() {
        let dir = tempfile::tempdir().unwrap();
        check_output_dir(dir.path(), "--out").unwrap();
        check_output_dir(&dir.path().join("a/b/c"), "--out").unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let err = check_output_dir(&file, "--out").unwrap_err().to_string();
        assert!(err.ends_with("is a file, not a directory"), "{err}");
        let err = check_output_dir(&file.join("sub"), "--out")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be"), "{err}");
    }
}
