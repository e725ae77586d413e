//! Which devices are tracked, and where each of their queues is counted: the loader puts a
//! tracked device in `DEVICES` with a range of slots, one per transmit queue.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use tap_probe_common::{DEVICE_TUN, DeviceCache, DeviceKey, DeviceSlot, MAX_DEVICES};

use crate::facts::{fact, read};

#[map]
static DEVICES: HashMap<DeviceKey, DeviceSlot> = HashMap::with_max_entries(MAX_DEVICES, 0);

/// Bumped by the loader after every change to `DEVICES`: invalidates the caches below.
#[map]
static GENERATION: Array<u64> = Array::with_max_entries(1, 0);

#[map]
static DEVICE_CACHE: PerCpuArray<DeviceCache> = PerCpuArray::with_max_entries(1, 0);

/// Where an event happened: the device, its queue, and that queue's counter slot.
#[derive(Clone, Copy)]
pub(crate) struct At {
    pub(crate) key: DeviceKey,
    pub(crate) slot: u32,
    pub(crate) queue: u16,
    /// `DeviceCache::flags`.
    pub(crate) flags: u32,
    /// The queue's `netdev_queue`.
    pub(crate) txq: u64,
}

/// The tracked device at `dev`, through this CPU's one-entry cache. An untracked device
/// that hits the cache costs two comparisons: a device that becomes tracked bumps the
/// generation. A tracked one is also checked to still have its ifindex, since its memory
/// may be another device's before the loader has seen it go.
#[inline(always)]
fn device(dev: u64) -> Option<DeviceCache> {
    let generation = GENERATION.get(0).copied().unwrap_or(0);
    let cache = DEVICE_CACHE.get_ptr_mut(0)?;
    // SAFETY: per-CPU; the programs sharing it do not interleave on one CPU mid-update
    // (and a torn entry would fail the checks below and be refilled).
    let cache = unsafe { &mut *cache };
    let hit = cache.dev == dev && cache.generation == generation;
    if hit && cache.queues == 0 {
        return None;
    }
    let ifindex: u32 = read(dev, fact!(dev_ifindex))?;
    if !hit || cache.key.ifindex != ifindex {
        let net: u64 = read(dev, fact!(dev_net))?;
        let netns: u32 = read(net, fact!(net_inum))?;
        let key = DeviceKey { netns, ifindex };
        // SAFETY: the value is copied out before any other map operation.
        let slot = unsafe { DEVICES.get(key) }.copied().unwrap_or_default();
        let tx = if slot.queues == 0 {
            0
        } else {
            read(dev, fact!(dev_tx))?
        };
        *cache = DeviceCache {
            dev,
            generation,
            tx,
            key,
            base: slot.base,
            queues: slot.queues,
            flags: slot.flags & tun_checked(dev, slot.flags),
            reserved: 0,
        };
    }
    (cache.queues != 0).then_some(*cache)
}

/// `slot_flags` without [`DEVICE_TUN`] unless the device's private area is a `tun_struct`
/// that points back at `dev`: a wrong offset never leads the ring samples astray.
#[inline(always)]
fn tun_checked(dev: u64, slot_flags: u32) -> u32 {
    if slot_flags & DEVICE_TUN == 0 || fact!(ring.known) == 0 {
        return !DEVICE_TUN;
    }
    let tun = dev + u64::from(fact!(ring.dev_priv));
    match read::<u64>(tun, fact!(ring.tun_dev)) {
        Some(back) if back == dev => u32::MAX,
        _ => !DEVICE_TUN,
    }
}

/// Queue `queue` of the tracked device `d`.
#[inline(always)]
fn at(d: &DeviceCache, queue: u16) -> Option<At> {
    // The loader sizes each device by its num_tx_queues, which bounds queue_mapping.
    (u32::from(queue) < d.queues).then_some(At {
        key: d.key,
        slot: d.base + u32::from(queue),
        queue,
        flags: d.flags,
        txq: d.tx + u64::from(queue) * u64::from(fact!(txq_size)),
    })
}

/// Where the packet `skb` on the `net_device` at `dev` is counted, if that device is
/// tracked: the device is looked at first, so an untracked one costs no read of `skb`.
#[inline(always)]
pub(crate) fn locate_skb(dev: u64, skb: u64) -> Option<At> {
    let d = device(dev)?;
    at(&d, read(skb, fact!(skb_queue_mapping))?)
}

/// Where the `netdev_queue` at `txq` of the `net_device` at `dev` is counted, if that device
/// is tracked.
#[inline(always)]
pub(crate) fn locate_txq(dev: u64, txq: u64) -> Option<At> {
    let d = device(dev)?;
    let size = u64::from(fact!(txq_size));
    if size == 0 || txq < d.tx {
        return None;
    }
    at(&d, u16::try_from((txq - d.tx) / size).ok()?)
}
