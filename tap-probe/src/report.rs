//! What one refresh shows: a row per (device, queue) with our counters and the kernel's own,
//! shared by the table, the JSON lines and the final summary.

use std::collections::BTreeMap;

use serde::Serialize;
use tap_probe_common::{DROP_REASON_XMIT_ERROR, QueueCounters};

use crate::discovery::{Device, DeviceKind, Owner};
use crate::probe::DeviceCounters;

/// The kernel's own counters of a device, as deltas since tap-probe started tracking it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelDeltas {
    /// tun/tap count a packet here when the reader takes it (`tun_put_user`).
    pub tx_packets: u64,
    /// Drops inside the driver's transmit (`tun_net_xmit`'s `drop:` path).
    pub tx_dropped: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub ifname: String,
    pub ifindex: u32,
    pub netns: String,
    pub kind: DeviceKind,
    pub queue: u32,
    pub owner: Option<Owner>,
    pub xmit_calls: u64,
    pub enqueued: u64,
    pub busy: u64,
    pub dropped_full_ring: u64,
    pub dropped_other: u64,
    /// `dropped_other` by `enum skb_drop_reason` name (lower case, without the prefix).
    pub drop_reasons: BTreeMap<String, u64>,
    pub consumed: u64,
    pub queue_stops: u64,
    pub queue_wakes: u64,
    /// Including the interval still running if the queue is stopped now.
    pub stopped_ns: u64,
    /// Whether the queue is stopped as last observed.
    pub stopped: bool,
    /// Times the reader slept between two takes (see `QueueCounters::reader_sleeps`).
    pub reader_sleeps: u64,
    /// `reader_sleeps / consumed`: wake-ups per packet delivered; absent before any take.
    pub wakeups_per_packet: Option<f64>,
    /// Per device: the same on every queue row of the device, since the kernel keeps no
    /// per-queue transmit statistics for these devices.
    pub kernel: KernelDeltas,
    /// The device disappeared; these are its last counters.
    pub retired: bool,
}

/// Maps `enum skb_drop_reason` values to names.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReasonNames(pub(crate) BTreeMap<u32, String>);

impl ReasonNames {
    #[must_use]
    pub(crate) fn name(&self, reason: u32) -> String {
        if reason == DROP_REASON_XMIT_ERROR {
            return "xmit_error".to_owned();
        }
        self.0
            .get(&reason)
            .cloned()
            .unwrap_or_else(|| format!("reason_{reason}"))
    }
}

/// The rows of one device: its queues in use, and any other queue that counted something.
#[must_use]
pub(crate) fn device_rows(
    device: &Device,
    counters: &DeviceCounters,
    kernel: KernelDeltas,
    names: &ReasonNames,
    now_ns: u64,
    retired: bool,
) -> Vec<Row> {
    counters
        .queues
        .iter()
        .zip(&counters.stopped_since)
        .enumerate()
        .filter(|(queue, (c, since))| {
            u32::try_from(*queue).is_ok_and(|q| q < device.active_queues.max(1))
                || **c != QueueCounters::default()
                || since.is_some()
        })
        .map(|(queue, (c, since))| {
            let queue = u32::try_from(queue).unwrap_or(u32::MAX);
            let drop_reasons = counters
                .drop_reasons
                .iter()
                .filter(|((q, _), _)| *q == queue)
                .map(|((_, reason), n)| (names.name(*reason), *n))
                .collect();
            let QueueCounters {
                xmit_calls,
                enqueued,
                busy,
                dropped_full_ring,
                dropped_other,
                consumed,
                queue_stops,
                queue_wakes,
                stopped_ns,
                reader_sleeps,
            } = *c;
            Row {
                ifname: device.name.clone(),
                ifindex: device.key.ifindex,
                netns: device.netns.clone(),
                kind: device.kind,
                queue,
                owner: device.owners.first().cloned(),
                xmit_calls,
                enqueued,
                busy,
                dropped_full_ring,
                dropped_other,
                drop_reasons,
                consumed,
                queue_stops,
                queue_wakes,
                stopped_ns: stopped_ns + since.map_or(0, |s| now_ns.saturating_sub(s)),
                stopped: since.is_some(),
                reader_sleeps,
                #[allow(clippy::cast_precision_loss, reason = "a ratio for display")]
                wakeups_per_packet: (consumed > 0).then(|| reader_sleeps as f64 / consumed as f64),
                kernel,
                retired,
            }
        })
        .collect()
}

/// One refresh.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Seconds since tap-probe attached.
    pub elapsed_s: f64,
    /// Which kernel hooks feed the counters.
    pub sources: crate::backend::Sources,
    /// The programs' own cost, in the final report of `watch --program-stats`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) programs: Option<Vec<crate::probe::ProgramStats>>,
    pub rows: Vec<Row>,
}
