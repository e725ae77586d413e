//! Finding the devices to watch: every tun, tap, veth and macvtap in every network
//! namespace, with the processes that hold tun/tap queues open.
//!
//! A device is identified by (namespace inode, ifindex), the same key the eBPF side
//! builds from `dev_net(dev)->ns.inum` and `dev->ifindex`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use globset::{Glob, GlobMatcher, GlobSet, GlobSetBuilder};
use tap_probe_common::DeviceKey;

use crate::os::netlink::{Link, LinkStats, Rtnl, TunKind};
use crate::os::netns::{self, NetnsInfo};
use crate::os::procfs::{self, Holder, tun_holders};
use crate::os::sysfs::Sysfs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Tun,
    Tap,
    Veth,
    Macvtap,
    Other,
}

impl DeviceKind {
    /// The kind of a link, from its `IFLA_INFO_KIND` and tun type.
    #[must_use]
    pub fn of(link: &Link) -> Self {
        match (link.kind.as_deref(), link.tun_kind) {
            (Some("tun"), Some(TunKind::Tap)) => Self::Tap,
            // A tun device whose type could not be read is reported as tun.
            (Some("tun"), _) => Self::Tun,
            (Some("veth"), _) => Self::Veth,
            (Some("macvtap"), _) => Self::Macvtap,
            _ => Self::Other,
        }
    }

    /// A tun or tap: a device of the tun driver, with a `ptr_ring` per queue.
    #[must_use]
    pub fn is_tun(self) -> bool {
        matches!(self, Self::Tun | Self::Tap)
    }
}

/// A process holding a tun/tap queue open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Owner {
    pub pid: u32,
    pub comm: String,
    /// The VM it runs, where its command line names one (QEMU's `-name`, libvirt's domain).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Device {
    #[serde(serialize_with = "serialize_key")]
    pub key: DeviceKey,
    pub name: String,
    /// [`NetnsInfo::name`] of the device's namespace.
    pub netns: String,
    pub kind: DeviceKind,
    /// `num_tx_queues`: every queue index the stack can pick. A multi-queue tap has 256
    /// of them whatever number of queues are attached.
    pub queues: u32,
    /// Queues in use (`real_num_tx_queues`; for a multi-queue tap, the queues attached).
    pub active_queues: u32,
    pub tx_queue_len: u32,
    pub owners: Vec<Owner>,
    pub stats: LinkStats,
    /// A tun/tap's flags (`/sys/class/net/DEV/tun_flags`); `None` for other devices, or when
    /// they could not be read.
    pub tun_flags: Option<u32>,
}

impl Device {
    /// `DeviceSlot::flags` for the programs: whether they sample the device's ring.
    #[must_use]
    pub(crate) fn slot_flags(&self) -> u32 {
        if self.kind.is_tun() {
            tap_probe_common::DEVICE_TUN
        } else {
            0
        }
    }
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's serialize_with passes a reference"
)]
fn serialize_key<S: serde::Serializer>(
    key: &DeviceKey,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct as _;
    let mut st = s.serialize_struct("DeviceKey", 2)?;
    st.serialize_field("netns", &key.netns_inode)?;
    st.serialize_field("ifindex", &key.ifindex)?;
    st.end()
}

/// Which devices to report: names matching any glob (all when empty), in the namespace
/// with this name (all when `None`); macvtap devices only when asked for.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub globs: Vec<String>,
    pub netns: Option<String>,
    /// Also macvtap devices, whose transmit-side counters are not exact (see
    /// [`MACVTAP_INEXACT`]).
    pub macvtap: bool,
}

/// Why macvtap is left out unless asked for: the probes see its transmit function, but its
/// ring is filled elsewhere. A macvtap's queue is fed by its rx handler on the lower device
/// (`tap_handle_frame`, `drivers/net/tap.c`), which drops on a full ring itself, while its
/// `ndo_start_xmit` (`macvlan_start_xmit`) sends the host's frames on down through the
/// lower device. Only `consumed` (the reader's takes, `tap_do_read`) counts the ring.
pub(crate) const MACVTAP_INEXACT: &str = "macvtap devices are watched, but only their consumed \
    (the reader's takes) is exact: their ring is filled by the rx handler on the lower device \
    (tap_handle_frame), not by their transmit function, so xmit_calls, enqueued, busy and \
    dropped_full_ring count frames sent out through macvlan, a different path, and ring drops \
    are not counted";

/// What one scan of the host found.
#[derive(Debug, Default, Clone)]
pub struct Scan {
    /// The devices that match the filter.
    pub(crate) matching: Vec<Device>,
    /// Devices of the drivers the programs count that the filter leaves out: the programs
    /// are told to skip them.
    pub(crate) left_out: Vec<DeviceKey>,
    /// The namespaces listed, by inode: `true` for those whose devices were read.
    pub(crate) namespaces: HashMap<u32, bool>,
}

/// Every tun, tap, veth and macvtap on the host, ignoring the filter; the plain macvlans;
/// and the namespaces listed, each with whether it could be read.
struct Survey {
    devices: Vec<Device>,
    macvlans: Vec<DeviceKey>,
    namespaces: HashMap<u32, bool>,
}

/// How long what a walk of every process's files found (the processes that hold tun/tap
/// files) and what sysfs said (each tap's `tun_flags`) are trusted. Walking every process's
/// files at every refresh would cost a dense host's exporter more than all else it does
/// (some 100,000 descriptors on a host of 1,000 VMs), so a scan walks them all once a
/// minute; between, it walks only the processes that started since its last walk, and only
/// when a tun/tap appeared: a VM's new tap is its holder's, a process that is new too. A tap
/// handed to a process that ran before, or attached to a running one, is seen within this;
/// flags are read again at once where a tap gained or lost a queue (a holder attaching or
/// detaching a file, which may set other flags).
const PROC_SCAN_MAX_AGE: Duration = Duration::from_mins(1);

/// What the walks of `/proc` found, and for which tun/taps.
#[derive(Debug)]
struct Holders {
    found: Vec<Holder>,
    /// When every process was walked last.
    at: Instant,
    /// The processes walked since.
    pids: HashSet<u32>,
    /// The tun/taps there were (namespace, name): one not among them means a walk of the
    /// processes that are new.
    devices: BTreeSet<(u32, String)>,
}

/// Scans the host for devices, keeping one rtnetlink socket per namespace between scans.
///
/// A cached socket keeps its namespace alive; sockets of namespaces that no longer show
/// up in `netns::list` are closed at the next scan so that deleted namespaces can go.
#[derive(Debug)]
pub struct Discovery {
    globs: Option<GlobSet>,
    netns: Option<GlobMatcher>,
    macvtap: bool,
    sockets: HashMap<u32, Rtnl>,
    /// A sysfs per namespace with tun/tap devices, for their `tun_flags`.
    sysfs: HashMap<u32, Sysfs>,
    /// Namespaces the kernel did not let this process enter, and why, by inode: their
    /// devices are not seen.
    refused: HashMap<u32, String>,
    /// The holders of tun/tap files, as the last walk of `/proc` found them.
    holders: Option<Holders>,
    /// Each tun/tap's `tun_flags`, with its queues in use when they were read, since the
    /// last walk of `/proc` (both are read again together).
    flags: HashMap<DeviceKey, (u32, Option<u32>)>,
}

impl Discovery {
    /// # Errors
    /// When a glob is malformed.
    pub fn new(filter: &Filter) -> Result<Self> {
        let globs = if filter.globs.is_empty() {
            None
        } else {
            let mut builder = GlobSetBuilder::new();
            for glob in &filter.globs {
                builder
                    .add(Glob::new(glob).with_context(|| format!("invalid device glob {glob:?}"))?);
            }
            Some(builder.build().context("cannot compile the device globs")?)
        };
        let netns = filter
            .netns
            .as_deref()
            .map(|ns| {
                Glob::new(ns)
                    .map(|g| g.compile_matcher())
                    .with_context(|| format!("invalid namespace glob {ns:?}"))
            })
            .transpose()?;
        if filter.macvtap {
            log::warn!("{MACVTAP_INEXACT}");
        }
        Ok(Self {
            globs,
            netns,
            macvtap: filter.macvtap,
            sockets: HashMap::new(),
            sysfs: HashMap::new(),
            refused: HashMap::new(),
            holders: None,
            flags: HashMap::new(),
        })
    }

    /// The devices matching the filter, and the others the programs would count.
    ///
    /// # Errors
    /// When the namespaces cannot be listed at all (no `/proc`). Namespaces and processes
    /// that disappear during the scan are skipped.
    pub fn scan(&mut self) -> Result<Scan> {
        let Survey {
            devices,
            macvlans,
            namespaces,
        } = self.survey()?;
        let (matching, others): (Vec<Device>, Vec<Device>) =
            devices.into_iter().partition(|d| self.matches(d));
        let mut left_out: Vec<DeviceKey> = others.iter().map(|d| d.key).collect();
        if self.macvtap {
            // The programs count macvlan's devices for macvtap: the plain macvlans too.
            left_out.extend(macvlans);
        }
        Ok(Scan {
            matching,
            left_out,
            namespaces,
        })
    }

    /// The devices matching the filter.
    ///
    /// # Errors
    /// As [`Discovery::scan`].
    pub fn matching(&mut self) -> Result<Vec<Device>> {
        Ok(self.scan()?.matching)
    }

    /// Every tun, tap, veth and macvtap on the host, ignoring the filter.
    ///
    /// # Errors
    /// When the namespaces cannot be listed at all.
    pub(crate) fn describe_all(&mut self) -> Result<Vec<Device>> {
        Ok(self.survey()?.devices)
    }

    /// Every tun, tap, veth and macvtap on the host; the plain macvlans; and the namespaces
    /// listed, each with whether it could be read.
    fn survey(&mut self) -> Result<Survey> {
        let namespaces = netns::list()?;
        let mut read = HashMap::new();
        let mut macvlans = Vec::new();
        let live: HashSet<u32> = namespaces.iter().map(|ns| ns.inode).collect();
        self.sockets.retain(|inode, _| live.contains(inode));
        self.sysfs.retain(|inode, _| live.contains(inode));
        self.refused.retain(|inode, _| live.contains(inode));

        let mut devices = Vec::new();
        for ns in &namespaces {
            read.insert(ns.inode, false);
            let links = match self.links_in(ns) {
                Ok(links) => links,
                Err(err) if denied(&err) => {
                    if !self.refused.contains_key(&ns.inode) {
                        log::warn!(
                            "cannot enter network namespace {} ({}), its devices are not \
                             watched: {err:#}",
                            ns.name,
                            ns.path.display()
                        );
                    }
                    self.refused
                        .insert(ns.inode, format!("{}: {err:#}", ns.name));
                    self.sockets.remove(&ns.inode);
                    continue;
                }
                Err(err) => {
                    // Typically the namespace vanished between listing and joining it.
                    log::debug!(
                        "skipping network namespace {} ({}): {err:#}",
                        ns.name,
                        ns.path.display()
                    );
                    self.sockets.remove(&ns.inode);
                    continue;
                }
            };
            read.insert(ns.inode, true);
            for link in links {
                let kind = DeviceKind::of(&link);
                if kind == DeviceKind::Other {
                    if link.kind.as_deref() == Some("macvlan") {
                        macvlans.push(DeviceKey {
                            netns_inode: ns.inode,
                            ifindex: link.ifindex,
                        });
                    }
                    continue;
                }
                let key = DeviceKey {
                    netns_inode: ns.inode,
                    ifindex: link.ifindex,
                };
                let tun_flags = if kind.is_tun() {
                    match self.flags.get(&key) {
                        Some(&(queues, flags)) if queues == link.real_num_tx_queues => flags,
                        _ => {
                            let flags = self.tun_flags(ns, &link.name);
                            self.flags.insert(key, (link.real_num_tx_queues, flags));
                            flags
                        }
                    }
                } else {
                    None
                };
                devices.push(Device {
                    key,
                    name: link.name,
                    netns: ns.name.clone(),
                    kind,
                    queues: link.num_tx_queues,
                    active_queues: link.real_num_tx_queues,
                    tx_queue_len: link.tx_queue_len,
                    owners: Vec::new(),
                    stats: link.stats,
                    tun_flags,
                });
            }
        }
        let tuns: BTreeSet<(u32, String)> = devices
            .iter()
            .filter(|d| d.kind.is_tun())
            .map(|d| (d.key.netns_inode, d.name.clone()))
            .collect();
        let present: HashSet<DeviceKey> = devices.iter().map(|d| d.key).collect();
        self.flags.retain(|key, _| present.contains(key));
        let holders = self.holders(tuns);
        attach_owners(&mut devices, &holders.found);
        self.holders = Some(holders);
        Ok(Survey {
            devices,
            macvlans,
            namespaces: read,
        })
    }

    /// The holders of tun/tap files of the processes there are, walked as
    /// [`PROC_SCAN_MAX_AGE`] says for the tun/taps `tuns`.
    fn holders(&mut self, tuns: BTreeSet<(u32, String)>) -> Holders {
        let pids = procfs::pids().unwrap_or_default();
        match self.holders.take() {
            // Stale after a while: the holders and the flags are read afresh together.
            Some(mut holders) if holders.at.elapsed() < PROC_SCAN_MAX_AGE => {
                let live: HashSet<u32> = pids.iter().copied().collect();
                holders.found.retain(|h| live.contains(&h.pid));
                holders.pids.retain(|pid| live.contains(pid));
                if !tuns.is_subset(&holders.devices) {
                    let new: Vec<u32> = pids
                        .into_iter()
                        .filter(|pid| !holders.pids.contains(pid))
                        .collect();
                    holders.found.extend(tun_holders(&new));
                    holders.pids.extend(new);
                }
                holders.devices = tuns;
                holders
            }
            _ => {
                self.flags.clear();
                Holders {
                    found: tun_holders(&pids),
                    at: Instant::now(),
                    pids: pids.into_iter().collect(),
                    devices: tuns,
                }
            }
        }
    }

    /// The namespaces the last scan could not enter, each as `name: why`.
    #[must_use]
    pub fn refused(&self) -> Vec<String> {
        let mut out: Vec<String> = self.refused.values().cloned().collect();
        out.sort();
        out
    }

    /// The `tun_flags` of tun/tap `name` in `ns`, through that namespace's sysfs (made once).
    /// A device that vanished since the link dump, or a namespace whose sysfs the kernel
    /// refuses, gives `None` (with a debug message).
    fn tun_flags(&mut self, ns: &NetnsInfo, name: &str) -> Option<u32> {
        let sysfs = match self.sysfs.entry(ns.inode) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => match Sysfs::of_netns(&ns.path) {
                Ok(sysfs) => e.insert(sysfs),
                Err(err) => {
                    log::debug!("no tun_flags in network namespace {}: {err:#}", ns.name);
                    return None;
                }
            },
        };
        let text = sysfs
            .net_attribute(name, "tun_flags")
            .map_err(|err| log::debug!("{name} (netns {}): {err:#}", ns.name))
            .ok()?;
        u32::from_str_radix(text.trim_start_matches("0x"), 16)
            .map_err(|err| log::debug!("{name}: tun_flags {text:?}: {err}"))
            .ok()
    }

    fn matches(&self, device: &Device) -> bool {
        (self.macvtap || device.kind != DeviceKind::Macvtap)
            && self
                .netns
                .as_ref()
                .is_none_or(|ns| ns.is_match(&device.netns))
            && self
                .globs
                .as_ref()
                .is_none_or(|globs| globs.is_match(&device.name))
    }

    /// The statistics of one device found by an earlier scan, read now through the socket
    /// that scan left open in its namespace.
    ///
    /// # Errors
    /// When its namespace is not open (no scan found it) or the device is gone.
    pub fn link_stats(&mut self, key: DeviceKey) -> Result<LinkStats> {
        let rtnl = self
            .sockets
            .get_mut(&key.netns_inode)
            .ok_or_else(|| anyhow!("network namespace {} is not open", key.netns_inode))?;
        Ok(rtnl.link_by_index(key.ifindex)?.stats)
    }

    fn links_in(&mut self, ns: &NetnsInfo) -> Result<Vec<Link>> {
        let rtnl = match self.sockets.entry(ns.inode) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let rtnl = Rtnl::open_in(&ns.path)?;
                // The path may have been reused by another namespace (a pid recycled, a
                // name deleted and re-added) between listing and opening: check.
                let inode = netns::run_in(&ns.path, netns::current_inode)?;
                if inode != ns.inode {
                    return Err(anyhow!(
                        "{} changed namespace during the scan",
                        ns.path.display()
                    ));
                }
                e.insert(rtnl)
            }
        };
        rtnl.links()
    }
}

/// Whether the kernel refused an operation for want of privilege (`EPERM`, `EACCES`), as
/// opposed to a namespace that went away.
fn denied(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<nix::errno::Errno>()
            .is_some_and(|e| matches!(e, nix::errno::Errno::EPERM | nix::errno::Errno::EACCES))
            || cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
    })
}

/// Attaches holders to tun/tap devices by name. fdinfo names the device but not its
/// namespace, so when several namespaces have a device of that name the one in the
/// holder's own namespace wins; failing that, every candidate gets the owner. A holder
/// that runs a named VM comes first: the process that made the tap (libvirtd, a network
/// script) may still hold it beside the QEMU it handed it to, and the rows name one owner.
fn attach_owners(devices: &mut [Device], holders: &[Holder]) {
    // By name, for a dense host's thousands of holders and devices.
    let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, d) in devices.iter().enumerate() {
        if matches!(d.kind, DeviceKind::Tun | DeviceKind::Tap) {
            by_name.entry(d.name.clone()).or_default().push(i);
        }
    }
    for holder in holders {
        let Some(candidates) = by_name.get(&holder.iff) else {
            continue;
        };
        let own: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| Some(devices[i].key.netns_inode) == holder.netns_inode)
            .collect();
        let chosen = if own.is_empty() { candidates } else { &own };
        for &i in chosen {
            devices[i].owners.push(Owner {
                pid: holder.pid,
                comm: holder.comm.clone(),
                vm: holder.vm.clone(),
            });
        }
    }
    for device in devices {
        // Stable: holders that name no VM keep their order (ascending pids).
        device.owners.sort_by_key(|owner| owner.vm.is_none());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, netns_inode: u32, kind: DeviceKind) -> Device {
        Device {
            key: DeviceKey {
                netns_inode,
                ifindex: 2,
            },
            name: name.to_owned(),
            netns: format!("ns{netns_inode}"),
            kind,
            queues: 1,
            active_queues: 1,
            tx_queue_len: 1000,
            owners: Vec::new(),
            stats: LinkStats::default(),
            tun_flags: None,
        }
    }

    #[test]
    fn owners_prefer_own_namespace() {
        let mut devices = vec![
            device("tap0", 1, DeviceKind::Tap),
            device("tap0", 2, DeviceKind::Tap),
            device("tap0", 3, DeviceKind::Veth),
        ];
        let holder = Holder {
            pid: 7,
            comm: "qemu".into(),
            netns_inode: Some(2),
            iff: "tap0".into(),
            vm: None,
        };
        attach_owners(&mut devices, std::slice::from_ref(&holder));
        assert!(devices[0].owners.is_empty());
        assert_eq!(
            devices[1].owners,
            vec![Owner {
                pid: 7,
                comm: "qemu".into(),
                vm: None,
            }]
        );
        assert!(devices[2].owners.is_empty());

        // A holder in a third namespace: ambiguous, both taps get it.
        let other = Holder {
            netns_inode: Some(9),
            ..holder
        };
        attach_owners(&mut devices, &[other]);
        assert_eq!(devices[0].owners.len(), 1);
        assert_eq!(devices[1].owners.len(), 2);
    }

    #[test]
    fn the_holder_that_runs_a_vm_is_named_first() {
        let mut devices = vec![device("vnet0", 1, DeviceKind::Tap)];
        let holder = |pid, vm: Option<&str>| Holder {
            pid,
            comm: format!("p{pid}"),
            netns_inode: Some(1),
            iff: "vnet0".into(),
            vm: vm.map(str::to_owned),
        };
        attach_owners(
            &mut devices,
            &[holder(3, None), holder(5, Some("web-01")), holder(9, None)],
        );
        let pids: Vec<u32> = devices[0].owners.iter().map(|o| o.pid).collect();
        assert_eq!(pids, [5, 3, 9]);
        assert_eq!(devices[0].owners[0].vm.as_deref(), Some("web-01"));
    }

    #[test]
    fn filter_matches_globs_and_netns() {
        let d = Discovery::new(&Filter {
            globs: vec!["tap*".into()],
            netns: Some("ns1".into()),
            macvtap: false,
        })
        .unwrap();
        assert!(d.matches(&device("tap0", 1, DeviceKind::Tap)));
        assert!(!d.matches(&device("veth0", 1, DeviceKind::Veth)));
        assert!(!d.matches(&device("tap0", 2, DeviceKind::Tap)));
        assert!(
            Discovery::new(&Filter {
                globs: vec!["[".into()],
                netns: None,
                macvtap: false,
            })
            .is_err()
        );
    }

    #[test]
    fn netns_filter_is_a_glob() {
        let d = Discovery::new(&Filter {
            globs: Vec::new(),
            netns: Some("ns*".into()),
            macvtap: false,
        })
        .unwrap();
        assert!(d.matches(&device("tap0", 1, DeviceKind::Tap)));
        assert!(d.matches(&device("tap0", 22, DeviceKind::Tap)));
        let d = Discovery::new(&Filter {
            globs: Vec::new(),
            netns: Some("ns2".into()),
            macvtap: false,
        })
        .unwrap();
        assert!(!d.matches(&device("tap0", 1, DeviceKind::Tap)));
    }
}

#[cfg(all(test, feature = "privileged-tests"))]
mod privileged_tests {
    use super::*;
    use crate::os::netns::{NamedNetns, run_in};
    use crate::os::tap::{Tap, TapOptions};

    #[test]
    fn finds_tap_with_owner_and_veth() {
        if !tap_probe_verdict::root() {
            return;
        }
        let ns = NamedNetns::create(&format!("tp-test-disc-{}", std::process::id())).unwrap();
        let tap = run_in(ns.path(), || {
            let tap = Tap::create("tpd-tap0", TapOptions::default())?;
            let mut rtnl = Rtnl::open()?;
            rtnl.add_veth("tpd-veth0", "tpd-veth1", None)?;
            Ok(tap)
        })
        .unwrap();

        let mut all = Discovery::new(&Filter {
            globs: Vec::new(),
            netns: Some(ns.name().to_owned()),
            macvtap: false,
        })
        .unwrap();
        let devices = all.matching().unwrap();
        assert_eq!(devices.len(), 3, "{devices:#?}");
        let found = devices.iter().find(|d| d.name == "tpd-tap0").unwrap();
        assert_eq!(found.kind, DeviceKind::Tap);
        assert_eq!(found.netns, ns.name());
        assert_eq!(
            found.key,
            DeviceKey {
                netns_inode: ns.inode(),
                ifindex: tap.ifindex()
            }
        );
        assert_eq!(found.queues, 1);
        assert!(
            found.owners.iter().any(|o| o.pid == std::process::id()),
            "{:?}",
            found.owners
        );
        // The flags the kernel keeps, read through the namespace's own sysfs.
        assert_eq!(
            found.tun_flags,
            Some(crate::os::tap::tun_flags_of(tap.queue_fd(0)).unwrap())
        );
        let veth = devices.iter().find(|d| d.name == "tpd-veth0").unwrap();
        assert_eq!(veth.kind, DeviceKind::Veth);
        assert!(veth.owners.is_empty());
        assert_eq!(veth.tun_flags, None);

        let mut taps = Discovery::new(&Filter {
            globs: vec!["tpd-tap*".into()],
            netns: None,
            macvtap: false,
        })
        .unwrap();
        let only = taps.matching().unwrap();
        assert_eq!(only.len(), 1, "{only:#?}");
        assert_eq!(only[0].name, "tpd-tap0");
        // describe_all ignores the filter.
        assert!(
            taps.describe_all()
                .unwrap()
                .iter()
                .any(|d| d.name == "tpd-veth1")
        );

        // Namespace gone: the next scan drops it quietly, and the cached socket with it.
        drop(tap);
        drop(ns);
        assert!(
            !taps
                .describe_all()
                .unwrap()
                .iter()
                .any(|d| d.name.starts_with("tpd-"))
        );
        assert!(all.matching().unwrap().is_empty());
    }
}
