//! The floor of the probe's cost, for `cargo xtask bench`: attaches the floor object (a
//! program of each name the probe has, returning at its first instruction) where `watch`
//! attaches the probe on this kernel (`--backend auto`), says so on stdout, and holds it
//! until SIGINT or SIGTERM. What tap-probe costs above the hooks' own dispatch is the
//! difference between a run beside this and a run beside `watch`. An example, so that it is
//! built by the benchmark and never shipped.
#![expect(
    unused_crate_dependencies,
    reason = "an example uses a few of the package's dependencies"
)]

use anyhow::Context as _;
use tap_probe_observer::bpf::backend::{self, Backend};
use tap_probe_observer::bpf::kprobe::Kprobes;
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::signals::Stop;

fn main() -> anyhow::Result<()> {
    let stop = Stop::install()?;
    let kernel = KernelInfo::load()?;
    let mut ebpf = aya::EbpfLoader::new()
        .load(aya::include_bytes_aligned!(concat!(
            env!("OUT_DIR"),
            "/floor"
        )))
        .context("loading the floor object")?;
    let mut kprobes = Kprobes::default();
    let sources = backend::attach(&mut ebpf, &mut kprobes, Backend::Auto, &kernel)?;
    println!("attached the floor: {sources}");
    while !stop.sleep(std::time::Duration::from_secs(1)) {}
    Ok(())
}
