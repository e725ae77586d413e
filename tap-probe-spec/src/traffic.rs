//! The traffic a tap gets in `load`, `demo`, `bench` and a spec's scenario: its root qdisc
//! and who reads it.

/// Who plays the VM on the tap's queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum ReaderKind {
    /// A thread calling `read(2)` on the queue, as QEMU does without vhost-net.
    #[default]
    Read,
    /// vhost-net, driven from userspace (the lab's `vhost`): the kernel's vhost worker takes
    /// the frames in batches, as it does for a VM with vhost-net, without a VM.
    Vhost,
}

/// The root qdisc `load`, `demo` and `check` install on their tap (`--qdisc`, a spec's
/// `qdisc`). Each is named as tap-probe has always named it (`fq-codel`) or as `tc` does
/// (`fq_codel`); reports use the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Qdisc {
    Noqueue,
    #[cfg_attr(feature = "cli", value(alias = "pfifo_fast"))]
    #[serde(alias = "pfifo_fast")]
    PfifoFast,
    Pfifo,
    /// `fq_codel` (the default of most distributions; a module or absent on some kernels).
    #[cfg_attr(feature = "cli", value(alias = "fq_codel"))]
    #[serde(alias = "fq_codel")]
    FqCodel,
}
