//! A small synchronous rtnetlink client: the handful of link and qdisc operations tap-probe
//! needs, without an async runtime.
//!
//! Every request carries `NLM_F_ACK` so that success is confirmed rather than assumed, and
//! every kernel error comes back as an `anyhow` error naming the operation, the errno and
//! the kernel's extended-ack message when it sent one.

mod link;
mod qdisc;
mod socket;

pub(crate) use link::Link;
pub use link::LinkStats;
pub(crate) use link::TunKind;
pub use qdisc::{QdiscStats, RootQdisc};
pub use socket::Rtnl;

#[cfg(all(test, feature = "privileged-tests"))]
mod privileged_tests {
    use super::socket::NetlinkError;
    use super::*;
    use crate::os::netns::{NamedNetns, run_in};
    use crate::os::tap::{Tap, TapOptions};

    fn json(ns: &str, cmd: &str, args: &[&str]) -> serde_json::Value {
        let out = std::process::Command::new(cmd)
            .args(["-n", ns, "-j"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn root_qdisc_json(ns: &str, dev: &str) -> serde_json::Value {
        let all = json(ns, "tc", &["-s", "qdisc", "show", "dev", dev]);
        all.as_array()
            .unwrap()
            .iter()
            .find(|q| q["root"].as_bool() == Some(true))
            .unwrap()
            .clone()
    }

    #[test]
    fn links_veth_and_qdiscs_match_iproute2() {
        if !tap_probe_verdict::root() {
            return;
        }
        let ns = NamedNetns::create(&format!("tp-test-rtnl-{}", std::process::id())).unwrap();
        let mut rtnl = Rtnl::open_in(ns.path()).unwrap();
        let lo = rtnl.link_by_name("lo").unwrap();
        assert_eq!(lo.ifindex, 1);
        assert!(
            rtnl.link_by_name("nope0")
                .unwrap_err()
                .to_string()
                .contains("no network device named nope0")
        );

        rtnl.add_veth("tpv0", "tpv1", None).unwrap();
        let err = rtnl.add_veth("tpv0", "tpv2", None).unwrap_err();
        assert!(
            err.downcast_ref::<NetlinkError>()
                .is_some_and(|e| e.errno == libc::EEXIST),
            "{err:#}"
        );
        let v0 = rtnl.link_by_name("tpv0").unwrap();
        assert_eq!(v0.kind.as_deref(), Some("veth"));
        assert_eq!(v0.tun_kind, None);
        rtnl.set_tx_queue_len(v0.ifindex, 77).unwrap();
        rtnl.set_up(v0.ifindex).unwrap();

        let ip = json(ns.name(), "ip", &["-d", "link", "show", "dev", "tpv0"]);
        let ip = &ip[0];
        let v0 = rtnl.link_by_name("tpv0").unwrap();
        assert_eq!(u64::from(v0.ifindex), ip["ifindex"].as_u64().unwrap());
        assert_eq!(u64::from(v0.tx_queue_len), ip["txqlen"].as_u64().unwrap());
        assert_eq!(
            u64::from(v0.num_tx_queues),
            ip["num_tx_queues"].as_u64().unwrap()
        );
        assert!(v0.up);
        assert_eq!(v0.qdisc.as_deref(), ip["qdisc"].as_str());
        assert_eq!(rtnl.links().unwrap().len(), 3);

        // pfifo with a limit, then noqueue, then pfifo_fast, each checked with tc.
        rtnl.replace_root_qdisc(v0.ifindex, RootQdisc::Pfifo { limit: Some(42) })
            .unwrap();
        let tc = root_qdisc_json(ns.name(), "tpv0");
        assert_eq!(tc["kind"], "pfifo");
        assert_eq!(tc["options"]["limit"], 42);
        let stats = rtnl.root_qdisc_stats(v0.ifindex).unwrap();
        assert_eq!(stats.kind, "pfifo");
        assert_eq!(stats.packets, tc["packets"].as_u64().unwrap());
        assert_eq!(stats.drops, tc["drops"].as_u64().unwrap());

        rtnl.replace_root_qdisc(v0.ifindex, RootQdisc::Noqueue)
            .unwrap();
        assert_eq!(root_qdisc_json(ns.name(), "tpv0")["kind"], "noqueue");
        assert_eq!(rtnl.root_qdisc_stats(v0.ifindex).unwrap().kind, "noqueue");
        rtnl.replace_root_qdisc(v0.ifindex, RootQdisc::PfifoFast)
            .unwrap();
        assert_eq!(root_qdisc_json(ns.name(), "tpv0")["kind"], "pfifo_fast");
    }

    #[test]
    fn tap_kind_queues_and_stats() {
        if !tap_probe_verdict::root() {
            return;
        }
        let ns = NamedNetns::create(&format!("tp-test-rtnlt-{}", std::process::id())).unwrap();
        let (tap, tun, mq) = run_in(ns.path(), || {
            Ok((
                Tap::create("tpt0", TapOptions::default())?,
                Tap::create(
                    "tpt1",
                    TapOptions {
                        tun: true,
                        ..TapOptions::default()
                    },
                )?,
                Tap::create(
                    "tpt2",
                    TapOptions {
                        multi_queue: true,
                        queues: 3,
                        ..TapOptions::default()
                    },
                )?,
            ))
        })
        .unwrap();
        let mut rtnl = Rtnl::open_in(ns.path()).unwrap();
        let t0 = rtnl.link_by_name("tpt0").unwrap();
        assert_eq!(t0.ifindex, tap.ifindex());
        assert_eq!(
            (t0.kind.as_deref(), t0.tun_kind),
            (Some("tun"), Some(TunKind::Tap))
        );
        assert_eq!((t0.num_tx_queues, t0.real_num_tx_queues), (1, 1));
        let t1 = rtnl.link_by_name("tpt1").unwrap();
        assert_eq!(t1.tun_kind, Some(TunKind::Tun));
        let t2 = rtnl.link_by_name("tpt2").unwrap();
        let ip = json(ns.name(), "ip", &["-d", "link", "show", "dev", "tpt2"]);
        assert_eq!(
            u64::from(t2.num_tx_queues),
            ip[0]["num_tx_queues"].as_u64().unwrap()
        );
        assert_eq!(t2.real_num_tx_queues, 3);
        assert_eq!(tun.name(), "tpt1");
        drop((tap, tun, mq));
        // Non-persistent: closing the fds removed the devices.
        assert_eq!(rtnl.links().unwrap().len(), 1);
    }
}
