//! A deliberately slow reader for a veth ring: the `slow_consumer` XDP program on the peer,
//! with the peer's NAPI threaded so it runs on another CPU than the sender.
//!
//! veth has applied qdisc backpressure since upstream commit dc82a33297fc (`NETDEV_TX_BUSY` and
//! queue stop/wake when its `ptr_ring` fills), the mechanism the tun series adds; without
//! threaded NAPI the peer's poll runs in the sender's own softirq and the ring never fills.

use anyhow::{Context as _, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    programs::{Xdp, XdpMode},
};
use tap_probe_common::{GLOBAL_SLOW_CONSUMER_NS, PROG_SLOW_CONSUMER};

use tap_probe_observer::bpf::object::Object;

/// The attached program; dropping it detaches it.
pub struct SlowConsumer {
    _ebpf: Ebpf,
}

impl SlowConsumer {
    /// Why a slow consumer cannot fill a veth's ring on this kernel, if it cannot: without
    /// threaded NAPI (`/sys/class/net/DEV/threaded`, Linux 5.12+) the peer's poll runs in
    /// the sender's own softirq, and takes each packet before the next is sent.
    #[must_use]
    pub fn unavailable() -> Option<String> {
        // Every device has the attribute where the kernel has threaded NAPI.
        (!std::path::Path::new("/sys/class/net/lo/threaded").exists()).then(|| {
            "this kernel has no threaded NAPI (/sys/class/net/DEV/threaded, Linux 5.12+): a \
             veth peer's poll runs in the sender's own softirq, so its ring never fills"
                .to_owned()
        })
    }

    /// Attaches to `ifindex` in the calling thread's network namespace, holding every packet
    /// for `hold_ns`, and makes that device's NAPI threaded (which the kernel accepts only
    /// once an XDP program is attached to a veth).
    ///
    /// # Errors
    /// When the program cannot be loaded or attached, or NAPI cannot be made threaded.
    pub fn attach(ifindex: u32, ifname: &str, hold_ns: u64) -> anyhow::Result<Self> {
        let mut ebpf = Object::Lab.load(EbpfLoader::new().override_global(
            GLOBAL_SLOW_CONSUMER_NS,
            &hold_ns,
            true,
        ))?;
        let program: &mut Xdp = ebpf
            .program_mut(PROG_SLOW_CONSUMER)
            .ok_or_else(|| {
                anyhow!("program {PROG_SLOW_CONSUMER} missing from the lab eBPF object")
            })?
            .try_into()?;
        program
            .load()
            .context("loading the slow-consumer XDP program")?;
        program
            .attach_to_if_index(ifindex, XdpMode::Default)
            .with_context(|| format!("attaching XDP to {ifname}"))?;
        set_threaded_napi(ifname)?;
        Ok(Self { _ebpf: ebpf })
    }
}

/// Writes 1 to `/sys/class/net/IFNAME/threaded`. sysfs shows the devices of the namespace
/// that mounted it, so this mounts a fresh sysfs in a private mount namespace of the calling
/// thread (which must already be in the device's network namespace, as `netns::run_in` does).
fn set_threaded_napi(ifname: &str) -> anyhow::Result<()> {
    use nix::mount::{MsFlags, mount};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .context("unshare(CLONE_NEWNS) to mount a sysfs for this network namespace")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making the private mount namespace private")?;
    mount(
        Some("sysfs"),
        "/sys",
        Some("sysfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .context("mounting sysfs for this network namespace")?;
    let path = format!("/sys/class/net/{ifname}/threaded");
    std::fs::write(&path, "1").with_context(|| format!("writing 1 to {path}"))
}
