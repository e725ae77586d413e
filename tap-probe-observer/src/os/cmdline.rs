//! Which VM a process runs, as its command line says: QEMU's `-name`, which libvirt sets to
//! the domain's name (`-name guest=DOMAIN,debug-threads=on`), so one reading serves a bare
//! QEMU and a libvirt domain alike.

/// Longer names are cut: a label value, not a document.
const MAX_NAME: usize = 256;

/// The VM named by `cmdline`, the NUL-separated arguments of `/proc/PID/cmdline`: the value
/// of QEMU's last `-name` (QEMU keeps the last of a repeated option), or `None` when there
/// is none or it names nothing.
#[must_use]
pub(crate) fn vm_name(cmdline: &[u8]) -> Option<String> {
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let value = args
        .windows(2)
        .rev()
        .find(|pair| pair[0] == b"-name" || pair[0] == b"--name")
        .map(|pair| String::from_utf8_lossy(pair[1]))?;
    guest(&value).map(|name| name.chars().take(MAX_NAME).collect())
}

/// The guest name in a `-name` value, a QEMU option string: `key=value` items separated by
/// commas, a literal comma written as two, and a first item without `=` standing for the
/// implied key (`guest`): `-name vm1`, `-name vm1,process=qemu-vm1`, `-name
/// guest=vm1,debug-threads=on`.
fn guest(value: &str) -> Option<String> {
    let items = split_options(value);
    let name = items
        .iter()
        .enumerate()
        .find_map(|(i, item)| match item.split_once('=') {
            Some(("guest", name)) => Some(name.to_owned()),
            None if i == 0 => Some(item.clone()),
            _ => None,
        })?;
    (!name.is_empty()).then_some(name)
}

/// QEMU's option syntax: split at single commas, `,,` standing for one comma in a value.
fn split_options(value: &str) -> Vec<String> {
    let mut items = vec![String::new()];
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            (',', Some(',')) => {
                chars.next();
                items.last_mut().expect("never empty").push(',');
            }
            (',', _) => items.push(String::new()),
            (c, _) => items.last_mut().expect("never empty").push(c),
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmdline(args: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for arg in args {
            out.extend_from_slice(arg.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn libvirt_writes_the_domain_as_guest() {
        let line = cmdline(&[
            "/usr/bin/qemu-system-x86_64",
            "-name",
            "guest=web-01,debug-threads=on",
            "-S",
            "-uuid",
            "0f6e1e12-33a4-4a0c-9d35-3f5c1d2e4b11",
        ]);
        assert_eq!(vm_name(&line).as_deref(), Some("web-01"));
    }

    #[test]
    fn a_bare_name_is_the_implied_guest_key() {
        for (value, name) in [
            ("vm1", Some("vm1")),
            ("vm1,process=qemu-vm1", Some("vm1")),
            ("debug-threads=on,guest=vm2", Some("vm2")),
            ("a,,b,process=x", Some("a,b")),
            ("process=only", None),
            ("", None),
            ("guest=", None),
        ] {
            let line = cmdline(&["qemu-system-x86_64", "--name", value]);
            assert_eq!(vm_name(&line).as_deref(), name, "{value:?}");
        }
    }

    #[test]
    fn the_last_name_wins_and_other_commands_have_none() {
        let line = cmdline(&["qemu", "-name", "first", "-m", "1G", "-name", "second"]);
        assert_eq!(vm_name(&line).as_deref(), Some("second"));
        assert_eq!(vm_name(&cmdline(&["sleep", "60"])), None);
        assert_eq!(vm_name(&cmdline(&["qemu", "-name"])), None, "no value");
        assert_eq!(vm_name(b""), None);
    }

    #[test]
    fn long_and_odd_names_stay_bounded_text() {
        let long = "x".repeat(1000);
        let line = cmdline(&["qemu", "-name", &long]);
        assert_eq!(vm_name(&line).map(|n| n.len()), Some(MAX_NAME));
        let mut odd = cmdline(&["qemu", "-name"]);
        odd.extend_from_slice(b"vm\xff\n1\0");
        assert_eq!(vm_name(&odd).as_deref(), Some("vm\u{fffd}\n1"));
    }
}
