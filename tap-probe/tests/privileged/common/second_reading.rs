//! The kernel's figures read a second way, past tap-probe's own rtnetlink code: the
//! device's statistics from sysfs and the qdisc's from `tc -s -j`, each run in the test's
//! namespace by `ip netns exec` (which mounts a sysfs of that namespace for the command).

use std::process::Command;

use tap_probe_observer::os::netlink::{QdiscStats, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};

use super::{Checks, Gate, Oracle};

/// Runs `command` in `ns` through `ip netns exec`; its standard output.
fn exec_in(ns: &NamedNetns, command: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .args(command)
        .output()
        .expect("ip runs");
    assert!(
        out.status.success(),
        "ip netns exec {} {command:?}: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `/sys/class/net/DEV/statistics/NAME` in `ns`, for each of `names`.
fn sysfs_statistics(ns: &NamedNetns, dev: &str, names: &[&str]) -> Vec<u64> {
    let paths: Vec<String> = names
        .iter()
        .map(|name| format!("/sys/class/net/{dev}/statistics/{name}"))
        .collect();
    let mut command = vec!["cat"];
    command.extend(paths.iter().map(String::as_str));
    exec_in(ns, &command)
        .lines()
        .map(|line| line.trim().parse().expect("a number"))
        .collect()
}

/// The device's statistics and, where it has one (`qdisc`), its root qdisc's, as rtnetlink
/// gives them, against sysfs and `tc -s -j`. The traffic has stopped, so both readings
/// see the same figures; they must not all be 0, or the comparison shows nothing.
pub(crate) fn check(checks: &mut Checks, ns: &NamedNetns, dev: &str, qdisc: bool) {
    let (link, root) = run_in(ns.path(), || {
        let mut rtnl = Rtnl::open()?;
        let link = rtnl.link_by_name(dev)?;
        let root = if qdisc {
            Some(rtnl.root_qdisc_stats(link.ifindex)?)
        } else {
            None
        };
        Ok((link, root))
    })
    .unwrap();
    let gate = Gate::none();
    let sysfs = sysfs_statistics(ns, dev, &["tx_packets", "tx_dropped"]);
    eprintln!(
        "{dev}: rtnetlink {:?}; sysfs tx_packets, tx_dropped {sysfs:?}",
        link.stats
    );
    checks.eq(
        &gate,
        Oracle::Sysfs,
        link.stats.tx_packets,
        sysfs[0],
        "tx_packets",
    );
    checks.eq(
        &gate,
        Oracle::Sysfs,
        link.stats.tx_dropped,
        sysfs[1],
        "tx_dropped",
    );
    assert!(
        link.stats.tx_packets > 0,
        "nothing was sent: {:?}",
        link.stats
    );
    let Some(root) = root else {
        assert!(
            link.stats.tx_dropped > 0,
            "nothing dropped: {:?}",
            link.stats
        );
        return;
    };
    let tc = tc_root_qdisc(ns, dev);
    eprintln!("{dev}: rtnetlink {root:?}; tc {tc:?}");
    checks.eq(
        &gate,
        Oracle::Tc,
        root.kind.as_str(),
        tc.kind.as_str(),
        "kind",
    );
    for (what, ours, theirs) in [
        ("packets", root.packets, tc.packets),
        ("bytes", root.bytes, tc.bytes),
        ("drops", root.drops, tc.drops),
        ("requeues", root.requeues, tc.requeues),
        ("overlimits", root.overlimits, tc.overlimits),
        ("qlen", root.qlen.into(), u64::from(tc.qlen)),
        ("backlog", root.backlog.into(), u64::from(tc.backlog)),
    ] {
        checks.eq(&gate, Oracle::Tc, ours, theirs, what);
    }
    assert!(root.packets > 0, "the qdisc handed out nothing: {root:?}");
    assert!(
        link.stats.tx_dropped + root.drops > 0,
        "nothing dropped, at the ring or the qdisc: {:?} {root:?}",
        link.stats
    );
}

/// The root qdisc of `dev` in `ns`, as `tc -s -j qdisc show` prints it.
fn tc_root_qdisc(ns: &NamedNetns, dev: &str) -> QdiscStats {
    let text = exec_in(ns, &["tc", "-s", "-j", "qdisc", "show", "dev", dev, "root"]);
    let all: serde_json::Value = serde_json::from_str(&text).expect("tc's JSON");
    let root = all
        .as_array()
        .and_then(|qdiscs| qdiscs.iter().find(|q| q["root"] == true))
        .unwrap_or_else(|| panic!("no root qdisc in {text}"));
    let number = |key: &str| {
        root[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no {key} in {root}"))
    };
    let small = |key: &str| u32::try_from(number(key)).expect("fits 32 bits");
    QdiscStats {
        kind: root["kind"].as_str().expect("a kind").to_owned(),
        packets: number("packets"),
        bytes: number("bytes"),
        drops: number("drops"),
        requeues: number("requeues"),
        overlimits: number("overlimits"),
        qlen: small("qlen"),
        backlog: small("backlog"),
    }
}
