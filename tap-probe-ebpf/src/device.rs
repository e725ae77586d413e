//! Which queues are counted, and in which slot each is counted.
//!
//! A device of a counted driver (tun/tap, veth) is recognised by its transmit function
//! (`dev->netdev_ops->ndo_start_xmit`, compared with the addresses kallsyms gave): the first
//! comparison every program makes, so the host's other traffic leaves at once. A queue of
//! a recognised device is looked up in `QUEUES`, where the loader puts the queues of the
//! devices it found, a slot each. One it does not find the programs register themselves at
//! its first packet, in a spare slot the loader keeps ready (`SPARE_SLOTS`): a queue the
//! device's holder attached since tracking began, or a device created since attach (then
//! `DEVICES` gets it too), so nothing a queue does goes uncounted. `DEVICES` also holds the
//! devices the loader leaves out, which the programs then skip.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, Queue},
};
use tap_probe_common::{
    DEVICE_BY_PROBES, DEVICE_LEFT_OUT, DeviceEntry, DeviceKey, MAX_DEVICES, MAX_DRIVERS,
    MAX_QUEUE_SLOTS, QUEUE_CACHE_ENTRIES, QueueCache, QueueKey, QueueSlot, SETTING_REGISTER,
};

use crate::facts::{KERNEL, Mem, fact};

#[map]
static DEVICES: HashMap<DeviceKey, DeviceEntry> = HashMap::with_max_entries(MAX_DEVICES, 0);

#[map]
static QUEUES: HashMap<QueueKey, QueueSlot> = HashMap::with_max_entries(MAX_QUEUE_SLOTS, 0);

/// Bumped by the loader after every change it makes to `DEVICES` or `QUEUES`: invalidates
/// the caches below. (A queue the programs register needs no bump: no cache holds it yet.)
#[map]
static GENERATION: Array<u64> = Array::with_max_entries(1, 0);

#[map]
static QUEUE_CACHE: PerCpuArray<QueueCache> = PerCpuArray::with_max_entries(QUEUE_CACHE_ENTRIES, 0);

/// Free slots, zeroed, for new queues.
#[map]
static SPARE_SLOTS: Queue<u32> = Queue::with_max_entries(tap_probe_common::SPARE_SLOTS, 0);

/// Events of new queues that found no spare slot left: counts that are short.
#[map]
static NO_ROOM: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Devices and queues the programs registered, per CPU: the loader looks for them when this
/// grows.
#[map]
static REGISTERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Switches the loader sets once it knows what attached (see `SETTING_*`).
#[map]
static SETTINGS: Array<u32> = Array::with_max_entries(tap_probe_common::SETTING_COUNT, 0);

/// Whether the loader turned setting `index` on.
#[inline(always)]
pub(crate) fn setting(index: u32) -> bool {
    SETTINGS.get(index).is_some_and(|v| *v != 0)
}

/// Where an event happened: the device, its queue, and that queue's slot.
#[derive(Clone, Copy)]
pub(crate) struct At {
    pub(crate) key: DeviceKey,
    pub(crate) slot: u32,
    pub(crate) queue: u16,
    /// `DeviceEntry::flags`.
    pub(crate) flags: u32,
}

/// The `DeviceEntry::flags` of the driver whose transmit function `dev` has, if it is one
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

/// Queue `queue` of the device at `dev`, if it is counted: through this CPU's cache, else
/// `QUEUES`, else registered now. `None` when `dev` is not a counted driver's, the loader
/// left it out (a negative entry), or it cannot be registered.
///
/// A cache entry is valid while the loader's generation is the one it was filled with and
/// the device at `dev` still has its ifindex and namespace: the memory of a device that
/// went may be another device's before the loader has seen the first go. Entries are
/// picked by ifindex and queue, so a CPU that sends on one queue and reads another, or
/// serves two devices, keeps each.
#[inline(always)]
pub(crate) fn locate<M: Mem>(dev: u64, queue: u16) -> Option<At> {
    lookup::<M>(dev, queue, recognised::<M>(dev)?)
}

/// With plain loads, the driver's flags: the first check, which every other device fails
/// at once (`None`). Through the probe helper (a kprobe, on a driver's own function) the
/// cache goes first, and a hit is checked by its ifindex alone: `Some(None)`.
#[inline(always)]
#[expect(
    clippy::option_option,
    reason = "not a counted device, or flags not read yet: what `?` and `lookup` take"
)]
fn recognised<M: Mem>(dev: u64) -> Option<Option<u32>> {
    if M::CHEAP {
        Some(Some(driver::<M>(dev)?))
    } else {
        Some(None)
    }
}

/// [`locate`] once the driver is recognised (`driver_flags`, where it was read).
#[inline(always)]
fn lookup<M: Mem>(dev: u64, queue: u16, driver_flags: Option<u32>) -> Option<At> {
    let generation = GENERATION.get(0).copied().unwrap_or(0);
    let ifindex: u32 = M::read(dev, fact!(dev_ifindex))?;
    let index = ifindex.wrapping_add(u32::from(queue)) & (QUEUE_CACHE_ENTRIES - 1);
    let cache = QUEUE_CACHE.get_ptr_mut(index)?;
    let c = load(cache);
    let net: u64 = if M::CHEAP {
        M::read(dev, fact!(dev_net))?
    } else {
        0
    };
    if c.dev == dev
        && dev != 0
        && c.generation == generation
        && c.key.ifindex == ifindex
        && c.queue == u32::from(queue)
        && (!M::CHEAP || c.net == net)
    {
        return at(&c);
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
    let qkey = QueueKey {
        device: key,
        queue: u32::from(queue),
    };
    // SAFETY: the value is copied out before any other map operation.
    let found = if let Some(q) = unsafe { QUEUES.get(qkey) }.copied() {
        q
    } else {
        // SAFETY: as above.
        let flags = if let Some(d) = unsafe { DEVICES.get(key) }.copied() {
            d.flags
        } else {
            let flags = match driver_flags {
                Some(flags) => flags,
                None => driver::<M>(dev)?,
            };
            register_device(key, flags)?
        };
        if flags & DEVICE_LEFT_OUT != 0 {
            QueueSlot { slot: 0, flags }
        } else {
            register_queue(qkey, flags)?
        }
    };
    let counted = found.flags & DEVICE_LEFT_OUT == 0;
    let entry = QueueCache {
        dev,
        generation,
        net,
        key,
        queue: u32::from(queue),
        slot: found.slot,
        flags: if counted {
            found.flags & crate::ring::tun_checked(dev, found.flags)
        } else {
            found.flags
        },
        reserved: 0,
        sealed_dev: dev,
        sealed_generation: generation,
    };
    store(cache, &entry);
    if counted && let Some(s) = crate::storage::shared(found.slot) {
        // Written again on every fill, read only by the sampler.
        s.dev = dev;
    }
    at(&entry)
}

/// The queue a cache entry names, unless its device is left out.
#[inline(always)]
fn at(c: &QueueCache) -> Option<At> {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a queue index the kernel keeps in 16 bits"
    )]
    (c.flags & DEVICE_LEFT_OUT == 0).then_some(At {
        key: c.key,
        slot: c.slot,
        queue: c.queue as u16,
        flags: c.flags,
    })
}

/// Registers a device the loader does not know (created since attach) at its first packet,
/// with its driver's flags: `None` when the loader has not turned registration on, or the
/// device map is full.
#[inline(always)]
fn register_device(key: DeviceKey, driver_flags: u32) -> Option<u32> {
    if !setting(SETTING_REGISTER) {
        return None;
    }
    let entry = DeviceEntry {
        flags: driver_flags | DEVICE_BY_PROBES,
        reserved: 0,
    };
    if DEVICES.insert(key, entry, u64::from(BPF_NOEXIST)).is_ok() {
        bump(&REGISTERED);
        return Some(entry.flags);
    }
    // Another CPU registered it first, or the map is full.
    // SAFETY: copied out at once.
    let found = unsafe { DEVICES.get(key) }.map(|d| d.flags);
    if found.is_none() {
        bump(&NO_ROOM);
    }
    found
}

/// Registers a queue of a device in `DEVICES` in a spare slot, at its first packet: `None`
/// when no spare slot is left (the event is then counted in `NO_ROOM`).
#[inline(always)]
fn register_queue(qkey: QueueKey, flags: u32) -> Option<QueueSlot> {
    let Ok(Some(slot)) = SPARE_SLOTS.pop() else {
        bump(&NO_ROOM);
        return None;
    };
    let value = QueueSlot { slot, flags };
    if QUEUES.insert(qkey, value, u64::from(BPF_NOEXIST)).is_ok() {
        bump(&REGISTERED);
        return Some(value);
    }
    // Another CPU registered it first (or the map is full): give the slot back and take
    // whatever is there.
    let _ = SPARE_SLOTS.push(slot, 0);
    // SAFETY: copied out at once.
    let found = unsafe { QUEUES.get(qkey) }.copied();
    if found.is_none() {
        bump(&NO_ROOM);
    }
    found
}

/// Adds one to this CPU's count in `map`.
#[inline(always)]
fn bump(map: &PerCpuArray<u64>) {
    if let Some(n) = map.get_ptr_mut(0) {
        // SAFETY: per-CPU.
        unsafe { *n += 1 };
    }
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
fn load(cache: *const QueueCache) -> QueueCache {
    use core::ptr::{addr_of, read_volatile};
    // SAFETY: `cache` is this CPU's map value; volatile keeps the reads in this order.
    unsafe {
        let sealed_dev = read_volatile(addr_of!((*cache).sealed_dev));
        let sealed_generation = read_volatile(addr_of!((*cache).sealed_generation));
        let mut entry = QueueCache {
            net: read_volatile(addr_of!((*cache).net)),
            key: read_volatile(addr_of!((*cache).key)),
            queue: read_volatile(addr_of!((*cache).queue)),
            slot: read_volatile(addr_of!((*cache).slot)),
            flags: read_volatile(addr_of!((*cache).flags)),
            ..QueueCache::default()
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
fn store(cache: *mut QueueCache, entry: &QueueCache) {
    use core::ptr::{addr_of_mut, write_volatile};
    // SAFETY: `cache` is this CPU's map value; volatile keeps the writes in this order.
    unsafe {
        write_volatile(addr_of_mut!((*cache).dev), entry.dev);
        write_volatile(addr_of_mut!((*cache).generation), entry.generation);
        write_volatile(addr_of_mut!((*cache).net), entry.net);
        write_volatile(addr_of_mut!((*cache).key), entry.key);
        write_volatile(addr_of_mut!((*cache).queue), entry.queue);
        write_volatile(addr_of_mut!((*cache).slot), entry.slot);
        write_volatile(addr_of_mut!((*cache).flags), entry.flags);
        write_volatile(addr_of_mut!((*cache).sealed_dev), entry.sealed_dev);
        write_volatile(
            addr_of_mut!((*cache).sealed_generation),
            entry.sealed_generation,
        );
    }
}

/// Where the packet `skb` on the `net_device` at `dev` is counted, if that device is
/// counted: the device is looked at first, so another device's packet costs no read of
/// `skb`.
#[inline(always)]
pub(crate) fn locate_skb<M: Mem>(dev: u64, skb: u64) -> Option<At> {
    let driver_flags = recognised::<M>(dev)?;
    lookup::<M>(dev, M::read(skb, fact!(skb_queue_mapping))?, driver_flags)
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
