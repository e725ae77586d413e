//! The counter table: every value tap-probe shows per device and transmit queue, declared
//! once, in the order the table, the JSON rows and the Prometheus families show them.
//!
//! A `counter` entry is a field of [`QueueCounters`], which the eBPF programs increment per
//! CPU at its [`Hook`] and the loader sums over CPUs (`AddAssign`). A `metric` entry is a
//! value the loader computes: a state, a ratio of counters, or one of the device's own kernel
//! statistics. Each entry also declares its [`MetricId`], by which the code asks for it.
//! Adding a plain per-queue counter takes an entry here and the increment on the eBPF side;
//! the outputs, the CPU sum and the tests follow from [`METRICS`].

use crate::EventKind;

/// How a value behaves over time, which decides how it is shown and exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Grows while the device is tracked (a Prometheus `counter`).
    Counter,
    /// A state at the moment of the refresh (a Prometheus `gauge`).
    Gauge,
    /// Computed from other values of the row. Not exported to Prometheus, which computes it
    /// from the counters over whatever window a query asks for.
    Derived,
    /// Samples of a level: the latest, the highest and a histogram of all of them since
    /// tracking began (Prometheus: a gauge, a `_max` gauge and a `_samples` histogram).
    Distribution,
}

/// What a value counts or measures, which decides how it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Packets,
    /// Events other than packets: queue transitions, reader sleeps.
    Events,
    /// Time; Prometheus gets seconds.
    Nanoseconds,
    /// Yes or no; Prometheus gets 1 or 0.
    Flag,
    /// A ratio per packet; undefined before the first packet.
    PerPacket,
    /// Entries of a ring.
    Entries,
}

/// What a value needs besides the programs every backend attaches. Where that is missing
/// the value is unknown (JSON `null`, no Prometheus sample, `-` in the table), never a zero
/// that looks measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requires {
    /// Always there.
    Nothing,
    /// Who woke the queue: the kprobe on `netif_tx_wake_queue` and its caller's stack.
    WakeSources,
    /// Reader takes: the `consume_skb` tracepoint's `location` (Linux 6.3+) or a kprobe on
    /// `consume_skb`; a kernel with neither counts every other value all the same.
    ReaderTakes,
    /// A tun or tap device: the value describes what only those have.
    Tun,
    /// A tun or tap whose `ptr_ring` the programs can find (offsets from BTF).
    TunRing,
    /// Flows' order followed (`watch --flows`): each driver call reads the packet's headers
    /// and updates a flow table, the costliest per-packet work, so it is asked for.
    Flows,
}

/// Where a value comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// A field of [`QueueCounters`], counted per CPU by the eBPF programs and summed over
    /// CPUs by the loader.
    Programs {
        /// The hook that counts it.
        hook: Hook,
        /// Where the programs keep it.
        store: Store,
        /// Reads the field.
        get: fn(&QueueCounters) -> u64,
    },
    /// Computed from the queue's counters; `None` where undefined.
    Counters(fn(&QueueCounters) -> Option<f64>),
    /// Whether the queue is stopped as last observed (`QUEUE_STATE`).
    QueueState,
    /// Whether the queue is stopped and its reader took nothing for longer than the
    /// watcher's `--stuck-after`: judged at each refresh from the queue state and
    /// `consumed`.
    Stuck,
    /// Whether the tun/tap stops its queue instead of tail-dropping when its ring fills
    /// (`IFF_BACKPRESSURE` in its `tun_flags`, or a kernel whose tun always does).
    Backpressure,
    /// Entries in the tap's `ptr_ring`, sampled at every driver call and reader take.
    RingOccupancy,
    /// The device's own statistics, as the kernel keeps them, since tracking began. The
    /// kernel keeps them per device, so every queue row of a device shows the same value.
    Kernel(KernelStat),
    /// Whether the device is counted since its first packet: it was created after
    /// tap-probe attached. Otherwise tracking began mid-life, and the kernel's statistics
    /// at that moment are the row's `kernel.*_at_start`.
    FromBirth,
}

/// Where the programs count a counter. The counters of one hook are fed by the same kernel
/// events, so a backend chooses one source for all of them, and the trace header names that
/// source's kind of hook for each counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// The driver call (`ndo_start_xmit`); the flows' order is read at its start and counted
    /// at its end.
    Xmit,
    /// Frees inside the driver (`skb:kfree_skb`), the only source of the drop reason.
    Drops,
    /// Reader takes (`consume_skb` from the read path).
    Consumed,
    /// The queue's `DRV_XOFF` bit, read where it changes or shows.
    QueueState,
    /// Packets the qdisc put back while the queue was stopped (`sch_direct_xmit`).
    Requeues,
    /// Who woke the queue (`netif_tx_wake_queue` and its caller).
    Wakes,
}

/// The device statistics (`IFLA_STATS64`) tap-probe compares its counters with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelStat {
    /// tun/tap count a packet here when the reader takes it (`tun_put_user`).
    TxPackets,
    /// Drops inside the driver's transmit (`tun_net_xmit`'s `drop:` path).
    TxDropped,
    /// Not a statistic of the kernel's: how far the two above may be off from the probes'
    /// counters because the two cannot be read at the same instant (packets the probes
    /// counted while the kernel's statistics were read, or before the kernel's baseline
    /// could be taken). 0 once traffic stops.
    Skew,
    /// `tx_packets` when tracking began: what tracking did not see. 0 for a device counted
    /// from birth.
    TxPacketsAtStart,
    /// `tx_dropped` when tracking began.
    TxDroppedAtStart,
}

/// What Prometheus gets of a value. By default a device has one series per family, so that
/// its series do not grow with its queues; `--per-queue` adds the `queue` label to every
/// per-queue value and exports every family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// Always. A per-queue value is summed over the device's queues by default (a flag then
    /// counts the queues it holds for), per queue with `--per-queue`.
    Device,
    /// Only with `--per-queue`: a breakdown of another family, or a fact about the device's
    /// baseline that dashboards and alerts do not need.
    Detail,
}

/// One value of a row.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// Its entry in the table: `METRICS[id as usize]` is this entry.
    pub id: MetricId,
    /// The JSON field of a row; a dot nests it in an object (`kernel.tx_packets`).
    pub name: &'static str,
    /// One line, for Prometheus' `# HELP`.
    pub help: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    pub source: Source,
    /// What the value needs to be known.
    pub requires: Requires,
    /// The table's column header; `None` shows the value as a note on the column before.
    pub column: Option<&'static str>,
    /// The Prometheus family, without the `tap_probe_` prefix; `None`: not exported.
    pub prometheus: Option<&'static str>,
    /// When it is exported.
    pub export: Export,
    /// The trace event recorded with each increment (`tap-probe record`).
    pub event: Option<EventKind>,
}

/// Where the programs keep a counter: in memory of their CPU, or in one copy per queue that
/// every CPU adds to. See [`PerCpuCounters`] and [`SharedCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// Counted on most packets: a plain increment of the CPU's own copy, which nothing else
    /// writes, summed over CPUs by the loader. Costs its size times the host's CPUs per queue.
    PerCpu,
    /// Counted at most once per queue stop or per uncommon event: an atomic add to the
    /// queue's one copy, whose cost does not grow with the host's CPUs.
    Shared,
}

/// What every value's help begins with: which way its packets go. A tap's transmit is its
/// guest's receive, which is easily read the wrong way round.
macro_rules! direction {
    () => {
        "Host to guest (the host's transmit, the guest's receive): "
    };
}

/// [`direction!`] for the outputs that write a help of their own (a family not in the table).
pub const DIRECTION: &str = direction!();

/// Declares [`QueueCounters`], [`PerCpuCounters`], [`SharedCounters`], their sums,
/// [`MetricId`] and [`METRICS`] from one list of entries: `counter field as Id { hook, store,
/// unit, .. }` for a field the programs count, `metric Id { name, help, .. }` for a value the
/// loader computes. Each help is prefixed with the [`direction!`].
macro_rules! queue_metrics {
    (@munch [$($def:tt)*] [$($field:ident)*] [$($pc:ident)*] [$($sh:ident)*] [$($id:tt)*] [$($metric:tt)*]
        $(#[doc = $doc:literal])*
        counter $name:ident as $variant:ident {
            hook: $hook:ident,
            store: $store:ident,
            unit: $unit:ident,
            $(event: $event:ident,)?
            $(requires: $requires:ident,)?
            column: $column:literal,
            prometheus: $prometheus:literal,
            $(export: $export:ident,)?
            help: $help:literal $(,)?
        }
        $($rest:tt)*
    ) => {
        queue_metrics!(@store $store
            [$($def)* $(#[doc = $doc])* pub $name: u64,]
            [$($field)* $name]
            [$($pc)*] [$($sh)*] $name
            [$($id)* $(#[doc = $doc])* $variant,]
            [$($metric)* Metric {
                id: MetricId::$variant,
                name: stringify!($name),
                help: concat!(direction!(), $help),
                kind: Kind::Counter,
                unit: Unit::$unit,
                source: Source::Programs {
                    hook: Hook::$hook,
                    store: Store::$store,
                    get: |c| c.$name,
                },
                requires: queue_metrics!(@requires $($requires)?),
                column: Some($column),
                prometheus: Some($prometheus),
                export: queue_metrics!(@export $($export)?),
                event: queue_metrics!(@event $($event)?),
            },]
            $($rest)*
        );
    };
    (@store PerCpu [$($def:tt)*] [$($field:ident)*] [$($pc:ident)*] [$($sh:ident)*] $name:ident
        [$($id:tt)*] [$($metric:tt)*] $($rest:tt)*
    ) => {
        queue_metrics!(@munch [$($def)*] [$($field)*] [$($pc)* $name] [$($sh)*] [$($id)*]
            [$($metric)*] $($rest)*);
    };
    (@store Shared [$($def:tt)*] [$($field:ident)*] [$($pc:ident)*] [$($sh:ident)*] $name:ident
        [$($id:tt)*] [$($metric:tt)*] $($rest:tt)*
    ) => {
        queue_metrics!(@munch [$($def)*] [$($field)*] [$($pc)*] [$($sh)* $name] [$($id)*]
            [$($metric)*] $($rest)*);
    };
    (@munch [$($def:tt)*] [$($field:ident)*] [$($pc:ident)*] [$($sh:ident)*] [$($id:tt)*] [$($metric:tt)*]
        metric $variant:ident { name: $name:literal, help: $help:literal, $($body:tt)* }
        $($rest:tt)*
    ) => {
        queue_metrics!(@munch
            [$($def)*]
            [$($field)*]
            [$($pc)*]
            [$($sh)*]
            // Its help is for Prometheus, plain text, so the id's documentation names it.
            [$($id)* #[doc = concat!("The value `", $name, "`.")] $variant,]
            [$($metric)* Metric {
                id: MetricId::$variant,
                name: $name,
                help: concat!(direction!(), $help),
                $($body)*
            },]
            $($rest)*
        );
    };
    (@munch [$($def:tt)*] [$($field:ident)*] [$($pc:ident)*] [$($sh:ident)*] [$($id:tt)*] [$($metric:tt)*]) => {
        /// Counters of one transmit queue of one device, as the loader shows them: the
        /// [`PerCpuCounters`] summed over CPUs and the [`SharedCounters`]. Generated from the
        /// counter table in `counters.rs`.
        #[repr(C)]
        #[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
        pub struct QueueCounters {
            $($def)*
        }

        /// The counters of [`Store::PerCpu`]: one copy per CPU and queue in the programs'
        /// per-CPU chunks, incremented without atomics.
        #[repr(C)]
        #[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
        pub struct PerCpuCounters {
            $(pub $pc: u64,)*
        }

        /// The counters of [`Store::Shared`]: one copy per queue, added to atomically.
        #[repr(C)]
        #[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
        pub struct SharedCounters {
            $(pub $sh: u64,)*
        }

        impl core::ops::AddAssign for QueueCounters {
            /// Adds another queue's, or another reading's, counts.
            fn add_assign(&mut self, other: Self) {
                $(self.$field += other.$field;)*
            }
        }

        impl core::ops::AddAssign for PerCpuCounters {
            /// Adds another CPU's counts.
            fn add_assign(&mut self, other: Self) {
                $(self.$pc += other.$pc;)*
            }
        }

        impl QueueCounters {
            /// A queue's counters from its per-CPU counters summed over CPUs and its shared
            /// ones.
            #[must_use]
            pub const fn of(per_cpu: &PerCpuCounters, shared: &SharedCounters) -> Self {
                Self {
                    $($pc: per_cpu.$pc,)*
                    $($sh: shared.$sh,)*
                }
            }
        }

        /// A value of a row, named in code: a misspelt one does not compile, where a name
        /// would be looked up at run time. In the table's order, which [`METRICS`] follows.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum MetricId {
            $($id)*
        }

        /// Every value of a row, in display order.
        pub const METRICS: &[Metric] = &[$($metric)*];
    };
    (@requires) => { Requires::Nothing };
    (@requires $requires:ident) => { Requires::$requires };
    (@export) => { Export::Device };
    (@export $export:ident) => { Export::$export };
    (@event) => { None };
    (@event $event:ident) => { Some(EventKind::$event) };
    ($($entries:tt)*) => {
        queue_metrics!(@munch [] [] [] [] [] [] $($entries)*);
    };
}

queue_metrics! {
    /// Calls into the driver's `ndo_start_xmit` (every `net:net_dev_xmit`).
    counter xmit_calls as XmitCalls {
        hook: Xmit,
        store: PerCpu,
        unit: Packets,
        column: "XMIT",
        prometheus: "xmit_calls_total",
        help: "calls into the driver's ndo_start_xmit.",
    }
    /// Packets the driver took (returned `NETDEV_TX_OK` without freeing them).
    counter enqueued as Enqueued {
        hook: Xmit,
        store: PerCpu,
        unit: Packets,
        event: Enqueued,
        column: "ENQUEUED",
        prometheus: "enqueued_total",
        help: "packets the driver took into its ring.",
    }
    /// `NETDEV_TX_BUSY` returns: the packet goes back to the qdisc.
    counter busy as Busy {
        hook: Xmit,
        store: Shared,
        unit: Packets,
        event: Busy,
        column: "BUSY",
        prometheus: "busy_total",
        help: "NETDEV_TX_BUSY returns (the packet goes back to the qdisc).",
    }
    /// Packets the qdisc handed to `sch_direct_xmit` and put back (`dev_requeue_skb`)
    /// without a driver call, because the queue was stopped: dequeued while stopped, the
    /// first packet after a stop that took the empty qdisc's bypass, or the rest of a bulk
    /// dequeue behind a stop. With `busy`, every requeue the qdisc counts.
    counter requeued_stopped as RequeuedStopped {
        hook: Requeues,
        store: Shared,
        unit: Packets,
        column: "REQ_STOP",
        prometheus: "requeued_stopped_total",
        help: "packets the qdisc put back without a driver call because the queue was stopped.",
    }
    /// Freed inside the driver with `SKB_DROP_REASON_FULL_RING`.
    counter dropped_full_ring as DroppedFullRing {
        hook: Drops,
        store: PerCpu,
        unit: Packets,
        event: DroppedFullRing,
        column: "FULL_RING",
        prometheus: "dropped_full_ring_total",
        help: "packets freed inside the driver because the ring was full (tail-drop).",
    }
    /// Freed inside the driver for any other reason (broken down in `DROP_REASONS`), or a
    /// driver return code that is neither OK nor BUSY.
    counter dropped_other as DroppedOther {
        hook: Drops,
        store: Shared,
        unit: Packets,
        event: DroppedOther,
        column: "OTHER",
        prometheus: "dropped_other_total",
        help: "packets freed inside the driver for another reason (see tap_probe_drop_reason_total).",
    }
    /// Packets the driver took out of their flow's order: a TCP segment carrying data (or
    /// SYN/FIN) whose IPv4 ID is below the next one its flow would hand over in order, or one
    /// of the project's sequence-numbered UDP frames below its flow's next sequence number
    /// (RFC 4737's "reordered"). A retransmission takes a fresh ID, so it is not counted.
    counter reordered as Reordered {
        hook: Xmit,
        store: Shared,
        unit: Packets,
        requires: Flows,
        column: "REORDERED",
        prometheus: "reordered_total",
        help: "packets the driver took out of their flow's order (TCP by IPv4 ID, tap-probe's UDP frames by sequence number).",
    }
    /// Flows `reordered` took up again mid-way (their first packet seen was not a SYN nor a
    /// frame numbered 0): forgotten to make room in its bounded flow table (an LRU of
    /// `MAX_FLOWS`), or begun before the device was tracked. What came late across that gap
    /// is not counted.
    counter flows_joined as FlowsJoined {
        hook: Xmit,
        store: Shared,
        unit: Events,
        requires: Flows,
        column: "FLOWS_JOINED",
        prometheus: "flows_joined_total",
        help: "flows whose order was taken up mid-way: evicted from the flow table, or begun before tracking.",
    }
    /// Packets the reader copied out of the ring and released (`consume_skb` from the
    /// tun/tap read path).
    counter consumed as Consumed {
        hook: Consumed,
        store: PerCpu,
        unit: Packets,
        event: Consumed,
        requires: ReaderTakes,
        column: "CONSUMED",
        prometheus: "consumed_total",
        help: "packets the reader (a VM's QEMU or vhost-net, a veth's peer) took out of the ring.",
    }
    /// Transitions of the queue's `__QUEUE_STATE_DRV_XOFF` bit to set, as observed.
    counter queue_stops as QueueStops {
        hook: QueueState,
        store: Shared,
        unit: Events,
        event: QueueStop,
        column: "STOPS",
        prometheus: "queue_stops_total",
        help: "transitions of the transmit queue to stopped (DRV_XOFF set).",
    }
    /// Transitions of the queue's `__QUEUE_STATE_DRV_XOFF` bit to clear, as observed.
    counter queue_wakes as QueueWakes {
        hook: QueueState,
        store: Shared,
        unit: Events,
        event: QueueWake,
        column: "WAKES",
        prometheus: "queue_wakes_total",
        help: "transitions of the transmit queue to running (DRV_XOFF cleared).",
    }
    /// Wakes by the queue's reader as it took packets: tun's `__tun_wake_queue` from the
    /// read path, veth's NAPI poll of the peer.
    counter wakes_reader as WakesReader {
        hook: Wakes,
        store: Shared,
        unit: Events,
        requires: WakeSources,
        column: "W_READER",
        prometheus: "wakes_reader_total",
        export: Detail,
        help: "queue wakes by the reader as it took packets (__tun_wake_queue from a read, veth_poll).",
    }
    /// Wakes by vhost-net after a batched take from the ring (`tun_wake_queue`).
    counter wakes_vhost as WakesVhost {
        hook: Wakes,
        store: Shared,
        unit: Events,
        requires: WakeSources,
        column: "W_VHOST",
        prometheus: "wakes_vhost_total",
        export: Detail,
        help: "queue wakes by vhost-net after a batched take (tun_wake_queue).",
    }
    /// Wakes that do not depend on the ring: a queue attached, the device reconfigured,
    /// the ring resized (`tun_force_wake_queue`).
    counter wakes_forced as WakesForced {
        hook: Wakes,
        store: Shared,
        unit: Events,
        requires: WakeSources,
        column: "W_FORCED",
        prometheus: "wakes_forced_total",
        export: Detail,
        help: "queue wakes on attach, TUNSETIFF or resize (tun_force_wake_queue).",
    }
    /// Wakes of a stopped queue from any other caller of `netif_tx_wake_queue`.
    counter wakes_other as WakesOther {
        hook: Wakes,
        store: Shared,
        unit: Events,
        requires: WakeSources,
        column: "W_OTHER",
        prometheus: "wakes_other_total",
        export: Detail,
        help: "queue wakes from any other caller of netif_tx_wake_queue.",
    }
    /// The lost-race re-check inside the driver call that stopped the queue: the reader
    /// made room between the stop and the re-check, so the driver woke the queue again
    /// before returning. Stop and wake fall within one driver call, so neither shows in
    /// `queue_stops` and `queue_wakes`.
    counter wakes_recheck as WakesRecheck {
        hook: Wakes,
        store: Shared,
        unit: Events,
        requires: WakeSources,
        column: "W_RECHECK",
        prometheus: "wakes_recheck_total",
        export: Detail,
        help: "stops undone by the driver's own re-check within the driver call (a lost race).",
    }
    /// Nanoseconds spent stopped, summed over completed stop..wake intervals (the loader
    /// adds a stop still running when it shows the value).
    counter stopped_ns as StoppedNs {
        hook: QueueState,
        store: Shared,
        unit: Nanoseconds,
        column: "STOPPED",
        prometheus: "stopped_seconds_total",
        help: "time the transmit queue spent stopped, including a stop still running.",
    }
    metric Stopped {
        name: "stopped",
        help: "1 while the transmit queue is stopped, as last observed.",
        kind: Kind::Gauge,
        unit: Unit::Flag,
        source: Source::QueueState,
        requires: Requires::Nothing,
        column: None,
        prometheus: Some("queue_stopped"),
        export: Export::Device,
        event: None,
    }
    metric Stuck {
        name: "stuck",
        help: "1 while the transmit queue is stopped and its reader took nothing for longer than --stuck-after.",
        kind: Kind::Gauge,
        unit: Unit::Flag,
        source: Source::Stuck,
        requires: Requires::Nothing,
        column: Some("STUCK"),
        prometheus: Some("queue_stuck"),
        export: Export::Device,
        event: None,
    }
    /// Times the queue's reader slept between two packets it took: the growth of the
    /// reader thread's voluntary context switches (`task_struct.nvcsw`) from one take to the
    /// next. Each is a read that found the ring empty and waited, ended by one wake-up, so
    /// `reader_sleeps / consumed` is the wake-ups per packet delivered.
    counter reader_sleeps as ReaderSleeps {
        hook: Consumed,
        store: PerCpu,
        unit: Events,
        requires: ReaderTakes,
        column: "SLEEPS",
        prometheus: "reader_sleeps_total",
        help: "times the queue's reader slept between two packets it took.",
    }
    metric WakeupsPerPacket {
        name: "wakeups_per_packet",
        help: "wake-ups of the queue's reader per packet it took (reader_sleeps / consumed).",
        kind: Kind::Derived,
        unit: Unit::PerPacket,
        source: Source::Counters(wakeups_per_packet),
        requires: Requires::ReaderTakes,
        column: None,
        prometheus: None,
        export: Export::Detail,
        event: None,
    }
    metric RingOccupancy {
        name: "ring_occupancy",
        help: "entries in the tap's ptr_ring, sampled at every driver call and reader take.",
        kind: Kind::Distribution,
        unit: Unit::Entries,
        source: Source::RingOccupancy,
        requires: Requires::TunRing,
        column: Some("RING"),
        prometheus: Some("ring_occupancy"),
        export: Export::Device,
        event: None,
    }
    metric Backpressure {
        name: "backpressure",
        help: "1 when the tap stops its transmit queue instead of tail-dropping (IFF_BACKPRESSURE).",
        kind: Kind::Gauge,
        unit: Unit::Flag,
        source: Source::Backpressure,
        requires: Requires::Tun,
        column: Some("BP"),
        prometheus: Some("backpressure"),
        export: Export::Device,
        event: None,
    }
    metric KernelTxPackets {
        name: "kernel.tx_packets",
        help: "the device's own tx_packets (on a tap: packets its guest received) since tracking began (per device, on every queue).",
        kind: Kind::Counter,
        unit: Unit::Packets,
        source: Source::Kernel(KernelStat::TxPackets),
        requires: Requires::Nothing,
        column: Some("K_TX_PKTS"),
        prometheus: Some("kernel_tx_packets_total"),
        export: Export::Device,
        event: None,
    }
    metric KernelTxDropped {
        name: "kernel.tx_dropped",
        help: "the device's own tx_dropped (on a tap: packets lost before its guest received them) since tracking began (per device, on every queue).",
        kind: Kind::Counter,
        unit: Unit::Packets,
        source: Source::Kernel(KernelStat::TxDropped),
        requires: Requires::Nothing,
        column: Some("K_TX_DROP"),
        prometheus: Some("kernel_tx_dropped_total"),
        export: Export::Device,
        event: None,
    }
    metric FromBirth {
        name: "from_birth",
        help: "1 when the device is counted since its first packet (created after tap-probe attached); 0 when tracking began mid-life.",
        kind: Kind::Gauge,
        unit: Unit::Flag,
        source: Source::FromBirth,
        requires: Requires::Nothing,
        column: Some("BIRTH"),
        prometheus: Some("tracked_from_birth"),
        export: Export::Device,
        event: None,
    }
    metric KernelTxPacketsAtStart {
        name: "kernel.tx_packets_at_start",
        help: "the device's own tx_packets when tracking began: what tap-probe did not see (0 from birth).",
        kind: Kind::Gauge,
        unit: Unit::Packets,
        source: Source::Kernel(KernelStat::TxPacketsAtStart),
        requires: Requires::Nothing,
        column: Some("K_TX0"),
        prometheus: Some("kernel_tx_packets_at_start"),
        export: Export::Detail,
        event: None,
    }
    metric KernelTxDroppedAtStart {
        name: "kernel.tx_dropped_at_start",
        help: "the device's own tx_dropped when tracking began (0 from birth).",
        kind: Kind::Gauge,
        unit: Unit::Packets,
        source: Source::Kernel(KernelStat::TxDroppedAtStart),
        requires: Requires::Nothing,
        column: Some("K_DROP0"),
        prometheus: Some("kernel_tx_dropped_at_start"),
        export: Export::Detail,
        event: None,
    }
    metric KernelSkew {
        name: "kernel.skew",
        help: "packets the kernel's columns may be off from tap-probe's by, as they cannot be read at the same instant (0 once traffic stops); while traffic flows, also by a read its reader is paused in between tun's count and consume_skb, one per reader thread at most.",
        kind: Kind::Gauge,
        unit: Unit::Packets,
        source: Source::Kernel(KernelStat::Skew),
        requires: Requires::Nothing,
        column: Some("K_SKEW"),
        prometheus: Some("kernel_skew_packets"),
        export: Export::Detail,
        event: None,
    }
}

#[expect(clippy::cast_precision_loss, reason = "a ratio for display")]
fn wakeups_per_packet(c: &QueueCounters) -> Option<f64> {
    (c.consumed > 0).then(|| c.reader_sleeps as f64 / c.consumed as f64)
}

impl MetricId {
    /// Its entry in [`METRICS`].
    #[must_use]
    pub const fn metric(self) -> &'static Metric {
        &METRICS[self as usize]
    }
}

impl EventKind {
    /// The counter this event is recorded with.
    #[must_use]
    pub fn counter(self) -> Option<&'static Metric> {
        METRICS.iter().find(|m| m.event == Some(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_field_is_summed_and_described() {
        let fields: Vec<fn(&QueueCounters) -> u64> = METRICS
            .iter()
            .filter_map(|m| match m.source {
                Source::Programs { get, .. } => Some(get),
                _ => None,
            })
            .collect();
        // One descriptor per u64 of the struct: none is left out of the outputs.
        assert_eq!(fields.len() * 8, size_of::<QueueCounters>());
        // Distinct values per field, so a field summed into another would show.
        let mut a = QueueCounters::default();
        let mut bytes = [0u64; 64];
        for (i, x) in (1..).zip(&mut bytes) {
            *x = i * 1000 + 1;
        }
        // SAFETY: QueueCounters is repr(C) of u64 fields only, and `bytes` holds more.
        unsafe {
            core::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (&raw mut a).cast::<u64>(),
                size_of::<QueueCounters>() / 8,
            );
        }
        let b = a;
        let mut sum = a;
        sum += b;
        for get in &fields {
            assert_eq!(get(&sum), get(&a) + get(&b));
        }
        let mut values: Vec<u64> = fields.iter().map(|get| get(&a)).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(
            values.len(),
            fields.len(),
            "each descriptor reads its own field"
        );
    }

    /// Each counter is kept in one place, per CPU or shared, and a queue's counters are
    /// those two put together, field by field.
    #[test]
    fn every_counter_is_kept_per_cpu_or_shared_and_put_back_together() {
        let stores: Vec<Store> = METRICS
            .iter()
            .filter_map(|m| match m.source {
                Source::Programs { store, .. } => Some(store),
                _ => None,
            })
            .collect();
        let per_cpu = stores.iter().filter(|&&s| s == Store::PerCpu).count();
        assert_eq!(per_cpu * 8, size_of::<PerCpuCounters>());
        assert_eq!((stores.len() - per_cpu) * 8, size_of::<SharedCounters>());
        let mut words = (1..).map(|i: u64| i * 1000 + 7);
        let mut per_cpu = PerCpuCounters::default();
        let mut shared = SharedCounters::default();
        for (store, bytes) in [
            (&raw mut per_cpu).cast::<u64>().cast::<()>(),
            (&raw mut shared).cast::<u64>().cast::<()>(),
        ]
        .into_iter()
        .zip([size_of::<PerCpuCounters>(), size_of::<SharedCounters>()])
        {
            for i in 0..bytes / 8 {
                // SAFETY: both are repr(C) of u64 fields only; `i` stays within.
                unsafe { *store.cast::<u64>().add(i) = words.next().unwrap() };
            }
        }
        let whole = QueueCounters::of(&per_cpu, &shared);
        let mut values: Vec<u64> = METRICS
            .iter()
            .filter_map(|m| match m.source {
                Source::Programs { get, .. } => Some(get(&whole)),
                _ => None,
            })
            .collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(
            values.len(),
            stores.len(),
            "each field comes from its own word"
        );
        assert!(
            values.iter().all(|v| v % 1000 == 7),
            "none is left zero: {values:?}"
        );
    }

    /// `MetricId::metric` indexes the table by the id's discriminant, which holds as long
    /// as the macro declares both in the same order.
    #[test]
    fn each_id_is_the_index_of_its_entry() {
        for (i, m) in METRICS.iter().enumerate() {
            assert_eq!(m.id as usize, i, "{}", m.name);
            assert_eq!(m.id.metric().name, m.name);
        }
    }

    #[test]
    fn names_and_event_kinds_are_unique() {
        for (i, m) in METRICS.iter().enumerate() {
            assert!(
                METRICS[i + 1..].iter().all(|o| o.name != m.name),
                "{} twice",
                m.name
            );
            assert_eq!(
                m.prometheus.is_none(),
                m.kind == Kind::Derived,
                "{}",
                m.name
            );
        }
        for kind in EventKind::ALL {
            let counters = METRICS.iter().filter(|m| m.event == Some(kind)).count();
            assert_eq!(counters, 1, "{kind:?} belongs to one counter");
            assert_eq!(kind.counter().map(|m| m.kind), Some(Kind::Counter));
        }
    }
}
