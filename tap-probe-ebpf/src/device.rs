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
    let cached = load(cache);
    let hit = cached.is_some_and(|c| c.dev == dev && c.generation == generation);
    if hit && cached.is_some_and(|c| c.queues == 0) {
        return None;
    }
    let ifindex: u32 = read(dev, fact!(dev_ifindex))?;
    let entry = match cached {
        Some(c) if hit && c.key.ifindex == ifindex => c,
        _ => {
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
            let entry = DeviceCache {
                dev,
                generation,
                tx,
                key,
                base: slot.base,
                queues: slot.queues,
                flags: slot.flags & tun_checked(dev, slot.flags),
                reserved: 0,
                sealed_dev: dev,
                sealed_generation: generation,
            };
            store(cache, &entry);
            entry
        }
    };
    (entry.queues != 0).then_some(entry)
}

/// This CPU's cache entry, if it is whole.
///
/// The programs that share it run in process context (`consume_skb` of a reader's
/// `read()`) and in softirq (a transmit), so one can interrupt another mid-update, though
/// never the other way round. [`store`] writes `dev` and `generation` first and seals the
/// entry with copies of both last; this reads the seal first and `dev` and `generation`
/// last. Whatever interrupts either one runs to its end before it goes on, so a torn
/// entry, or a torn copy of one, has a seal that does not match and is refilled.
#[inline(always)]
fn load(cache: *const DeviceCache) -> Option<DeviceCache> {
    use core::ptr::{addr_of, read_volatile};
    // SAFETY: `cache` is this CPU's map value; volatile keeps the reads in this order.
    unsafe {
        let sealed_dev = read_volatile(addr_of!((*cache).sealed_dev));
        let sealed_generation = read_volatile(addr_of!((*cache).sealed_generation));
        let mut entry = DeviceCache {
            tx: read_volatile(addr_of!((*cache).tx)),
            key: read_volatile(addr_of!((*cache).key)),
            base: read_volatile(addr_of!((*cache).base)),
            queues: read_volatile(addr_of!((*cache).queues)),
            flags: read_volatile(addr_of!((*cache).flags)),
            ..DeviceCache::default()
        };
        entry.dev = read_volatile(addr_of!((*cache).dev));
        entry.generation = read_volatile(addr_of!((*cache).generation));
        entry.sealed_dev = sealed_dev;
        entry.sealed_generation = sealed_generation;
        (entry.dev == sealed_dev && entry.generation == sealed_generation && entry.dev != 0)
            .then_some(entry)
    }
}

/// Writes `entry` into this CPU's cache in the order [`load`] relies on.
#[inline(always)]
fn store(cache: *mut DeviceCache, entry: &DeviceCache) {
    use core::ptr::{addr_of_mut, write_volatile};
    // SAFETY: `cache` is this CPU's map value; volatile keeps the writes in this order.
    unsafe {
        write_volatile(addr_of_mut!((*cache).dev), entry.dev);
        write_volatile(addr_of_mut!((*cache).generation), entry.generation);
        write_volatile(addr_of_mut!((*cache).tx), entry.tx);
        write_volatile(addr_of_mut!((*cache).key), entry.key);
        write_volatile(addr_of_mut!((*cache).base), entry.base);
        write_volatile(addr_of_mut!((*cache).queues), entry.queues);
        write_volatile(addr_of_mut!((*cache).flags), entry.flags);
        write_volatile(addr_of_mut!((*cache).sealed_dev), entry.sealed_dev);
        write_volatile(
            addr_of_mut!((*cache).sealed_generation),
            entry.sealed_generation,
        );
    }
}

/// `slot_flags` without [`DEVICE_TUN`] unless the device's private area is a `tun_struct`
/// that points back at `dev` (and rings are sampled at all): a wrong offset never leads the
/// ring samples astray.
#[inline(always)]
fn tun_checked(dev: u64, slot_flags: u32) -> u32 {
    if slot_flags & DEVICE_TUN == 0 || fact!(ring.known) == 0 || !crate::ring::wanted() {
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
