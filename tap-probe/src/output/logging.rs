//! How log records reach stderr: `env_logger`'s own lines for people at a terminal, or one
//! line per record with a syslog priority prefix (`<3>` error ... `<7>` debug, sd-daemon(3))
//! for a service manager: journald reads the prefix as the entry's priority, so `journalctl
//! -p warning` shows what went wrong, and strips it from the message.

use std::fmt::Write as _;
use std::io::Write as _;

/// Who reads stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    /// A person: warnings and errors by default.
    Terminal,
    /// journald (or any syslog-style reader): what the service does, from info up by
    /// default.
    Journal,
}

/// Installs the logger; `RUST_LOG` overrides the default level.
pub(crate) fn init(style: Style) {
    // aya warns on every program load where it cannot parse the kernel release (Debian's
    // `7.3-cloud-amd64` has no patch level); it needs the version only for kprobes on
    // kernels before 5.0, which tap-probe does not run on (it needs BTF).
    let default = match style {
        Style::Terminal => "warn,aya::util=error",
        Style::Journal => "info,aya::util=error",
    };
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default));
    if style == Style::Journal {
        builder.format(|buf, record| {
            buf.write_all(
                journal_lines(record.level(), record.target(), &record.args().to_string())
                    .as_bytes(),
            )
        });
    }
    builder.init();
}

/// A record as journald reads it: each line of the message with the record's priority, so
/// a message of several lines stays at its level (journald takes a line without a prefix as
/// `info`). Records of other crates name where they come from.
fn journal_lines(level: log::Level, target: &str, message: &str) -> String {
    let priority = match level {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    };
    let from = if target.starts_with("tap_probe") {
        String::new()
    } else {
        format!("{target}: ")
    };
    let mut out = String::new();
    for line in message.lines() {
        let _ = writeln!(out, "<{priority}>{from}{line}");
    }
    if out.is_empty() {
        out = format!("<{priority}>{from}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_carries_its_priority() {
        assert_eq!(
            journal_lines(
                log::Level::Warn,
                "tap_probe_observer::host::watcher",
                "tap0 is gone"
            ),
            "<4>tap0 is gone\n"
        );
        assert_eq!(
            journal_lines(
                log::Level::Error,
                "tap_probe",
                "refresh failed:\ncannot list /proc"
            ),
            "<3>refresh failed:\n<3>cannot list /proc\n"
        );
        assert_eq!(
            journal_lines(log::Level::Debug, "aya::bpf", "loaded"),
            "<7>aya::bpf: loaded\n"
        );
        assert_eq!(journal_lines(log::Level::Info, "tap_probe", ""), "<6>\n");
    }
}
