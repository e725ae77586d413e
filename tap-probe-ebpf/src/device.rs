//! Which devices are counted, and where each of their queues is counted.
//!
//! A device of a counted driver (tun/tap, veth) is recognised by its transmit function
//! (`dev->netdev_ops->ndo_start_xmit`, compared with the addresses kallsyms gave): the first
//! comparison every program makes, so the host's other traffic leaves at once. A recognised
//! device is looked up in `DEVICES`, where the loader puts the devices it found with a range
//! of slots (one per transmit queue). One the loader does not know yet (created since attach)
//! the programs register themselves at its first packet, in a spare range the loader keeps
//! ready (`SPARE_SINGLES`, `SPARE_RANGES`), so nothing a new device does goes uncounted.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, Queue},
};
use tap_probe_common::{
    DEVICE_BY_PROBES, DeviceCache, DeviceKey, DeviceSlot, MAX_DEVICES, MAX_DRIVERS,
    MAX_QUEUE_SLOTS, MAX_QUEUES_PER_DEVICE, SETTING_REGISTER, SPARE_RANGE_COUNT,
    SPARE_SINGLE_COUNT,
};

use crate::facts::{KERNEL, Mem, fact};

#[map]
static DEVICES: HashMap<DeviceKey, DeviceSlot> = HashMap::with_max_entries(MAX_DEVICES, 0);

/// Bumped by the loader after every change it makes to `DEVICES`: invalidates the caches
/// below. (A device the programs register needs no bump: no cache holds it yet.)
#[map]
static GENERATION: Array<u64> = Array::with_max_entries(1, 0);

#[map]
static DEVICE_CACHE: PerCpuArray<DeviceCache> = PerCpuArray::with_max_entries(1, 0);

/// Bases of free single slots, zeroed, for new devices with one transmit queue.
#[map]
static SPARE_SINGLES: Queue<u32> = Queue::with_max_entries(SPARE_SINGLE_COUNT, 0);

/// Bases of free ranges of `MAX_QUEUES_PER_DEVICE` slots, zeroed, for new multi-queue
/// devices.
#[map]
static SPARE_RANGES: Queue<u32> = Queue::with_max_entries(SPARE_RANGE_COUNT, 0);

/// Events of new devices that found no spare slots left: counts that are short.
#[map]
static NO_ROOM: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Devices the programs registered, per CPU: the loader looks for them in `DEVICES` when
/// this grows.
#[map]
static REGISTERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per queue slot: the `net_device` it counts, written when the slot's device is looked up,
/// for the ring sampler that the loader runs (`ring::sample_rings`).
#[map]
static SLOT_DEV: Array<u64> = Array::with_max_entries(MAX_QUEUE_SLOTS, 0);

/// The `net_device` the slots from `base` count, as the programs last saw it (0 before).
#[inline(always)]
pub(crate) fn slot_dev(base: u32) -> Option<u64> {
    SLOT_DEV.get(base).copied()
}

/// Switches the loader sets once it knows what attached (see `SETTING_*`).
#[map]
static SETTINGS: Array<u32> = Array::with_max_entries(tap_probe_common::SETTING_COUNT, 0);

/// Whether the loader turned setting `index` on.
#[inline(always)]
pub(crate) fn setting(index: u32) -> bool {
    SETTINGS.get(index).is_some_and(|v| *v != 0)
}

/// Where an event happened: the device, its queue, and that queue's counter slot.
#[derive(Clone, Copy)]
pub(crate) struct At {
    pub(crate) key: DeviceKey,
    pub(crate) slot: u32,
    pub(crate) queue: u16,
    /// `DeviceSlot::flags`.
    pub(crate) flags: u32,
}

/// The `DeviceSlot::flags` of the driver whose transmit function `dev` has, if it is one
/// whose devices are counted: one load of `dev->netdev_ops`, one of its `ndo_start_xmit`,
/// and a comparison per driver.
#[inline(always)]
pub(crate) fn driver<M: Mem>(dev: u64) -> Option<u32> {
    let ops: u64 = M::read(dev, fact!(dev_netdev_ops))?;
    let xmit: u64 = M::read(ops, fact!(ops_start_xmit))?;
    let n = fact!(driver_count) as usize;
    for i in 0..MAX_DRIVERS {
        if i >= n {
            break;
        }
        // SAFETY: a plain read of the loader's value.
        let d = unsafe { core::ptr::read_volatile(&raw const KERNEL.drivers[i]) };
        if xmit == d.start_xmit && xmit != 0 {
            return Some(d.flags);
        }
    }
    None
}

/// The counted device at `dev`, through this CPU's one-entry cache; `None` when `dev` is
/// not a counted driver's, or the loader left it out (a negative entry, `queues == 0`).
///
/// The cache holds the last device looked up on this CPU. It is valid while the loader's
/// generation is the one it was filled with and the device at `dev` still has its ifindex
/// and namespace: the memory of a device that went may be another device's before the
/// loader has seen the first go.
#[inline(always)]
pub(crate) fn device<M: Mem>(dev: u64) -> Option<DeviceCache> {
    // Plain loads: the driver first, which every other device fails at once. Through the
    // probe helper (a kprobe, on a driver's own function) the cache goes first, and a hit
    // is checked by its ifindex alone.
    let driver_flags = if M::CHEAP {
        Some(driver::<M>(dev)?)
    } else {
        None
    };
    let generation = GENERATION.get(0).copied().unwrap_or(0);
    let cache = DEVICE_CACHE.get_ptr_mut(0)?;
    let c = load(cache);
    let ifindex: u32 = M::read(dev, fact!(dev_ifindex))?;
    let net: u64 = if M::CHEAP {
        M::read(dev, fact!(dev_net))?
    } else {
        0
    };
    if c.dev == dev
        && dev != 0
        && c.generation == generation
        && c.key.ifindex == ifindex
        && (!M::CHEAP || c.net == net)
    {
        return (c.queues != 0).then_some(c);
    }
    let net: u64 = if M::CHEAP {
        net
    } else {
        M::read(dev, fact!(dev_net))?
    };
    let netns_inode: u32 = M::read(net, fact!(net_inum))?;
    let key = DeviceKey {
        netns_inode,
        ifindex,
    };
    // SAFETY: the value is copied out before any other map operation.
    let slot = if let Some(slot) = unsafe { DEVICES.get(key) }.copied() {
        slot
    } else {
        let flags = match driver_flags {
            Some(flags) => flags,
            None => driver::<M>(dev)?,
        };
        register::<M>(dev, key, flags)?
    };
    let entry = DeviceCache {
        dev,
        generation,
        net,
        key,
        base: slot.base,
        queues: slot.queues,
        flags: slot.flags & crate::ring::tun_checked(dev, slot.flags),
        reserved: 0,
        sealed_dev: dev,
        sealed_generation: generation,
    };
    store(cache, &entry);
    if slot.queues != 0
        && let Some(at) = SLOT_DEV.get_ptr_mut(slot.base)
    {
        // SAFETY: a map value; written again on every fill, read only by the sampler.
        unsafe { *at = dev };
    }
    (entry.queues != 0).then_some(entry)
}

/// Registers a device the loader does not know (created since attach) in a spare range,
/// at its first packet: `None` when the loader has not turned registration on, or no spare
/// range is left (the event is then counted in `NO_ROOM`).
#[inline(always)]
fn register<M: Mem>(dev: u64, key: DeviceKey, driver_flags: u32) -> Option<DeviceSlot> {
    if !setting(SETTING_REGISTER) {
        return None;
    }
    let queues: u32 = M::read(dev, fact!(dev_num_tx_queues))?;
    let (queues, pool) = if queues <= 1 {
        (1, &SPARE_SINGLES)
    } else {
        (queues.min(MAX_QUEUES_PER_DEVICE), &SPARE_RANGES)
    };
    let Ok(Some(base)) = pool.pop() else {
        if let Some(n) = NO_ROOM.get_ptr_mut(0) {
            // SAFETY: per-CPU.
            unsafe { *n += 1 };
        }
        return None;
    };
    let slot = DeviceSlot {
        base,
        queues,
        flags: driver_flags | DEVICE_BY_PROBES,
        reserved: 0,
    };
    if DEVICES.insert(key, slot, u64::from(BPF_NOEXIST)).is_ok() {
        if let Some(n) = REGISTERED.get_ptr_mut(0) {
            // SAFETY: per-CPU.
            unsafe { *n += 1 };
        }
        return Some(slot);
    }
    // Another CPU registered it first (or the map is full): give the range back and take
    // whatever is there.
    let _ = pool.push(base, 0);
    // SAFETY: copied out at once.
    unsafe { DEVICES.get(key) }.copied()
}

/// This CPU's cache entry, with `dev` 0 (no device's) unless it is whole. Not an `Option`:
/// the compiler may read the fields of a `None` before it checks, and before Linux 5.12 the
/// verifier refuses any read of stack that was never written.
///
/// The programs that share it run in process context (`consume_skb` of a reader's
/// `read()`) and in softirq (a transmit), so one can interrupt another mid-update, though
/// never the other way round. [`store`] writes `dev` and `generation` first and seals the
/// entry with copies of both last; this reads the seal first and `dev` and `generation`
/// last. Whatever interrupts either one runs to its end before it goes on, so a torn
/// entry, or a torn copy of one, has a seal that does not match and is refilled.
#[inline(always)]
fn load(cache: *const DeviceCache) -> DeviceCache {
    use core::ptr::{addr_of, read_volatile};
    // SAFETY: `cache` is this CPU's map value; volatile keeps the reads in this order.
    unsafe {
        let sealed_dev = read_volatile(addr_of!((*cache).sealed_dev));
        let sealed_generation = read_volatile(addr_of!((*cache).sealed_generation));
        let mut entry = DeviceCache {
            net: read_volatile(addr_of!((*cache).net)),
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
        if entry.dev != sealed_dev || entry.generation != sealed_generation {
            entry.dev = 0;
        }
        entry
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
        write_volatile(addr_of_mut!((*cache).net), entry.net);
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

/// Queue `queue` of the counted device `d`.
#[inline(always)]
pub(crate) fn at(d: &DeviceCache, queue: u16) -> Option<At> {
    // The loader sizes each device by its num_tx_queues, which bounds queue_mapping; a
    // multi-queue device's queues beyond MAX_QUEUES_PER_DEVICE are not counted.
    (u32::from(queue) < d.queues).then_some(At {
        key: d.key,
        slot: d.base + u32::from(queue),
        queue,
        flags: d.flags,
    })
}

/// Where the packet `skb` on the `net_device` at `dev` is counted, if that device is
/// counted: the device is looked at first, so another device's packet costs no read of
/// `skb`.
#[inline(always)]
pub(crate) fn locate_skb<M: Mem>(dev: u64, skb: u64) -> Option<At> {
    let d = device::<M>(dev)?;
    at(&d, M::read(skb, fact!(skb_queue_mapping))?)
}

/// The index of the `netdev_queue` at `txq` among the queues of the device at `dev`.
#[inline(always)]
pub(crate) fn queue_index<M: Mem>(dev: u64, txq: u64) -> Option<u16> {
    let tx: u64 = M::read(dev, fact!(dev_tx))?;
    let size = u64::from(fact!(txq_size));
    if size == 0 || txq < tx {
        return None;
    }
    u16::try_from((txq - tx) / size).ok()
}

/// The `state` word of queue `queue` of the device at `dev`. Queue 0's is read through
/// `dev->_tx` as `M` reads; another queue's sits at an offset the verifier cannot check
/// against the type, so it is read with the probe helper.
#[inline(always)]
pub(crate) fn txq_state<M: Mem>(dev: u64, queue: u16) -> Option<u64> {
    let tx: u64 = M::read(dev, fact!(dev_tx))?;
    if queue == 0 {
        return M::read(tx, fact!(txq_state));
    }
    crate::facts::read(
        tx + u64::from(queue) * u64::from(fact!(txq_size)),
        fact!(txq_state),
    )
}
