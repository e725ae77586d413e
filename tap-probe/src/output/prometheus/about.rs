//! What the exporter says about itself and the kernel it runs on, as info families (a
//! sample of 1 whose labels carry the facts): which build serves the counters, and whether
//! the kernel's tun could stop a queue instead of tail-dropping. Alert rules join them on
//! `instance`: "this tap drops, and this kernel has `IFF_BACKPRESSURE`".

use std::fmt::Write as _;

use tap_probe_observer::kernel::{KernelInfo, TunBackpressure};

/// Facts fixed for the life of the process.
#[derive(Clone, Debug)]
pub(crate) struct About {
    pub(crate) version: &'static str,
    pub(crate) commit: &'static str,
    /// `uname -r`.
    pub(crate) release: String,
    /// How this kernel's tun answers a full ring (see [`TunBackpressure`]).
    pub(crate) tun_backpressure: Option<TunBackpressure>,
}

impl About {
    #[must_use]
    pub(crate) fn of(kernel: &KernelInfo) -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION"),
            commit: crate::cli::COMMIT,
            release: kernel.release.clone(),
            tun_backpressure: kernel.tun_backpressure,
        }
    }

    /// Appends the info families to an exposition.
    pub(crate) fn write(&self, out: &mut String) {
        let tun = match self.tun_backpressure {
            Some(TunBackpressure::Never) => "never",
            Some(TunBackpressure::Always) => "always",
            Some(TunBackpressure::OptIn) => "opt-in",
            None => "unknown",
        };
        let _ = write!(
            out,
            "# HELP tap_probe_build_info The tap-probe build serving these counters.\n\
             # TYPE tap_probe_build_info gauge\n\
             tap_probe_build_info{{version=\"{}\",commit=\"{}\"}} 1\n\
             # HELP tap_probe_kernel_info The running kernel, and how its tun answers a full \
             ring under a qdisc (tun_backpressure: never = tail-drop; opt-in = a tap that sets \
             IFF_BACKPRESSURE stops its queue; always = every tap stops its queue).\n\
             # TYPE tap_probe_kernel_info gauge\n\
             tap_probe_kernel_info{{release=\"{}\",tun_backpressure=\"{tun}\"}} 1\n",
            super::escape(self.version),
            super::escape(self.commit),
            super::escape(&self.release),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_says_whether_taps_could_push_back() {
        let mut about = About {
            version: "1.2.3",
            commit: "0123abcd",
            release: "7.3-cloud-amd64".to_owned(),
            tun_backpressure: Some(TunBackpressure::OptIn),
        };
        let mut out = String::new();
        about.write(&mut out);
        assert!(
            out.contains("\ntap_probe_build_info{version=\"1.2.3\",commit=\"0123abcd\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "\ntap_probe_kernel_info{release=\"7.3-cloud-amd64\",tun_backpressure=\"opt-in\"} 1\n"
            ),
            "{out}"
        );
        about.tun_backpressure = None;
        let mut out = String::new();
        about.write(&mut out);
        assert!(out.contains("tun_backpressure=\"unknown\"} 1\n"), "{out}");
    }
}
