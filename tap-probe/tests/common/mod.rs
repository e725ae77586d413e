//! Test hosts: each test builds its own network namespace and devices, removed by guards on
//! drop (also when an assertion fails).
#![allow(
    dead_code,
    reason = "each test binary uses its own subset of these helpers"
)]

use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, Result};
use tap_probe::lab::{NamedNetns, run_in};
use tap_probe::lab::{RootQdisc, Rtnl};
use tap_probe::lab::{Tap, TapOptions};

/// A namespace name no other test or run uses.
pub(crate) fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "tp-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private namespace with IPv6 off, so the kernel sends nothing of its own (router
/// solicitations, MLD) into the devices: every frame in them is the test's.
pub(crate) fn quiet_netns(tag: &str) -> Result<NamedNetns> {
    let ns = NamedNetns::create(&unique(tag))?;
    run_in(ns.path(), || {
        for knob in ["all", "default"] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1")
                .with_context(|| format!("disabling IPv6 ({knob})"))?;
        }
        Ok(())
    })?;
    Ok(ns)
}

/// A tap in `ns` with the given root qdisc, up. Dropping the tap removes the device.
pub(crate) fn tap_in(ns: &NamedNetns, name: &str, qdisc: RootQdisc) -> Result<Tap> {
    run_in(ns.path(), || {
        let tap = Tap::create(name, TapOptions::default())?;
        let mut rtnl = Rtnl::open()?;
        rtnl.replace_root_qdisc(tap.ifindex(), qdisc)?;
        rtnl.set_up(tap.ifindex())?;
        Ok(tap)
    })
}

/// A watcher for each backend this kernel can run, all attached at once so they count the
/// same traffic; backends the kernel cannot run are skipped with a message.
pub(crate) fn watchers(
    filter: &tap_probe::lab::Filter,
) -> Vec<(tap_probe::lab::Backend, tap_probe::lab::Watcher)> {
    use tap_probe::lab::Backend;
    let kernel = tap_probe::lab::KernelInfo::load().expect("the kernel's facts");
    let mut all = Vec::new();
    for backend in [Backend::Tracepoint, Backend::Kprobe] {
        match tap_probe::lab::Watcher::with_backend(&kernel, filter, backend) {
            Ok(w) => all.push((backend, w)),
            Err(err) => eprintln!("skipping backend {backend:?} - {err:#}"),
        }
    }
    assert!(!all.is_empty(), "no backend attaches on this kernel");
    all
}

/// Every backend counted the same traffic identically: every value of the rows but the
/// times (two backends see a stop at slightly different instants).
pub(crate) fn assert_backends_agree(rows: &[(tap_probe::lab::Backend, tap_probe::lab::Row)]) {
    let exact = tap_probe_common::METRICS
        .iter()
        .filter(|m| m.unit != tap_probe_common::Unit::Nanoseconds);
    for metric in exact {
        for (backend, row) in &rows[1..] {
            assert_eq!(
                row.value(metric),
                rows[0].1.value(metric),
                "{}: {backend:?} and {:?} saw the same traffic",
                metric.name,
                rows[0].0
            );
        }
    }
}
