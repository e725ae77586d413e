//! `replay --live`: the policies on a real ring shared by two pinned threads, to measure
//! what the model cannot: the cost of stopping and waking.
//!
//! The ring is `ptr_ring`'s layout and protocol with real atomics: an array of words where
//! 0 is NULL, a producer that fails when `slot[producer] != 0`, a consumer that zeroes
//! consumed slots in batches (in reverse, as `__ptr_ring_discard_one` does). A stopped
//! queue parks the producer thread; a wake clears the flag and unparks it, a futex wake
//! when it sleeps, standing in for the softirq the kernel raises to rerun the qdisc. With
//! `tail-drop` the producer never stops and a full ring drops the item.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};

use super::policy::Policy;
use super::ring::batch_for;

#[derive(Debug, Clone, Copy)]
pub struct LiveConfig {
    pub ring_size: u32,
    pub cache_batch: u32,
    pub duration: Duration,
    /// Busy work per consumed item, in rounds of a small loop (0: none), to make the reader
    /// the slower side as a VM is.
    pub consumer_work: u32,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveResult {
    pub policy: String,
    pub ring_size: u32,
    /// Items the consumer took per second.
    pub items_per_s: f64,
    pub delivered: u64,
    pub dropped: u64,
    /// Items the consumer never saw, told from the gaps in their sequence numbers: the
    /// consumer's own account of what `dropped` counts on the producer's side (drops after
    /// the last item it took leave no gap).
    pub missing: u64,
    pub busy: u64,
    pub stops: u64,
    pub wakes: u64,
    pub elapsed_s: f64,
    /// CPUs the producer and the consumer ran on (None: not pinned).
    pub cpus: Option<(usize, usize)>,
}

#[repr(align(128))]
struct Padded<T>(T);

struct Shared {
    slots: Box<[AtomicUsize]>,
    stopped: Padded<AtomicBool>,
    done: Padded<AtomicBool>,
}

#[derive(Default)]
struct ProducerStats {
    dropped: u64,
    busy: u64,
    stops: u64,
    wakes: u64,
}

/// Runs one policy for `cfg.duration`.
///
/// # Errors
/// When a thread cannot be spawned or panics, or the ring size is 0.
pub fn run(cfg: &LiveConfig, policy: Policy) -> anyhow::Result<LiveResult> {
    if cfg.ring_size == 0 {
        return Err(anyhow!("a live ring needs at least one slot"));
    }
    let shared = Arc::new(Shared {
        slots: (0..cfg.ring_size).map(|_| AtomicUsize::new(0)).collect(),
        stopped: Padded(AtomicBool::new(false)),
        done: Padded(AtomicBool::new(false)),
    });
    let cpus = two_cpus();
    let barrier = Arc::new(Barrier::new(3));
    let size = cfg.ring_size as usize;
    let batch = batch_for(cfg.ring_size, cfg.cache_batch) as usize;
    let threshold = policy.wake_threshold(cfg.ring_size);
    let stops = policy.stops();

    let producer = {
        let shared = Arc::clone(&shared);
        let barrier = Arc::clone(&barrier);
        std::thread::Builder::new()
            .name("live-producer".into())
            .spawn(move || {
                if let Some((cpu, _)) = cpus {
                    pin(cpu);
                }
                barrier.wait();
                produce(&shared, size, stops)
            })
            .context("spawning the producer")?
    };
    let producer_thread = producer.thread().clone();
    let consumer = {
        let shared = Arc::clone(&shared);
        let barrier = Arc::clone(&barrier);
        let work = cfg.consumer_work;
        std::thread::Builder::new()
            .name("live-consumer".into())
            .spawn(move || {
                if let Some((_, cpu)) = cpus {
                    pin(cpu);
                }
                barrier.wait();
                consume(
                    &shared,
                    size,
                    batch,
                    stops,
                    threshold,
                    work,
                    &producer_thread,
                )
            })
            .context("spawning the consumer")?
    };
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(cfg.duration);
    shared.done.0.store(true, Ordering::Release);
    let elapsed = start.elapsed().as_secs_f64();
    producer.thread().unpark();
    let p = producer
        .join()
        .map_err(|_| anyhow!("the producer thread panicked"))?;
    let (delivered, consumer_wakes, missing) = consumer
        .join()
        .map_err(|_| anyhow!("the consumer thread panicked"))?;
    #[expect(clippy::cast_precision_loss, reason = "a rate")]
    let items_per_s = delivered as f64 / elapsed;
    Ok(LiveResult {
        policy: policy.to_string(),
        ring_size: cfg.ring_size,
        items_per_s,
        delivered,
        dropped: p.dropped,
        missing,
        busy: p.busy,
        stops: p.stops,
        wakes: p.wakes + consumer_wakes,
        elapsed_s: elapsed,
        cpus,
    })
}

fn produce(shared: &Shared, size: usize, stops: bool) -> ProducerStats {
    let slots = &shared.slots;
    let mut stats = ProducerStats::default();
    let mut producer = 0usize;
    let mut item = 1usize;
    let mut n = 0u32;
    loop {
        n = n.wrapping_add(1);
        if n.is_multiple_of(256) && shared.done.0.load(Ordering::Relaxed) {
            break;
        }
        if stops && shared.stopped.0.load(Ordering::Acquire) {
            // The queue is stopped: nothing is sent until the reader wakes it.
            while shared.stopped.0.load(Ordering::Acquire) {
                if shared.done.0.load(Ordering::Acquire) {
                    return stats;
                }
                std::thread::park_timeout(Duration::from_millis(1));
            }
        }
        // __ptr_ring_produce.
        let ok = slots[producer].load(Ordering::Acquire) == 0;
        if ok {
            slots[producer].store(item, Ordering::Release);
            producer += 1;
            if producer >= size {
                producer = 0;
            }
            item = item.wrapping_add(1).max(1);
        }
        if !stops {
            if !ok {
                stats.dropped += 1;
                item = item.wrapping_add(1).max(1);
            }
            continue;
        }
        // __ptr_ring_produce_peek, stop, barrier, re-check.
        if slots[producer].load(Ordering::Acquire) != 0 {
            shared.stopped.0.store(true, Ordering::SeqCst);
            stats.stops += 1;
            fence(Ordering::SeqCst);
            if slots[producer].load(Ordering::Acquire) == 0
                && shared.stopped.0.swap(false, Ordering::AcqRel)
            {
                stats.wakes += 1;
            }
        }
        if !ok {
            // NETDEV_TX_BUSY: the same item is tried again.
            stats.busy += 1;
        }
    }
    stats
}

fn consume(
    shared: &Shared,
    size: usize,
    batch: usize,
    stops: bool,
    threshold: u32,
    work: u32,
    producer: &std::thread::Thread,
) -> (u64, u64, u64) {
    let slots = &shared.slots;
    let (mut head, mut tail) = (0usize, 0usize);
    let mut delivered = 0u64;
    // The producer numbers its items from 1 and skips a number for each drop.
    let mut expected = 1usize;
    let mut missing = 0u64;
    let mut wakes = 0u64;
    let mut cons_cnt = 0u32;
    let wake = |cons_cnt: &mut u32, wakes: &mut u64| {
        if shared.stopped.0.swap(false, Ordering::AcqRel) {
            *wakes += 1;
            producer.unpark();
        }
        *cons_cnt = 0;
    };
    loop {
        let v = slots[head].load(Ordering::Acquire);
        if v == 0 {
            if shared.done.0.load(Ordering::Relaxed) {
                break;
            }
            std::hint::spin_loop();
            continue;
        }
        missing += u64::try_from(v.wrapping_sub(expected)).unwrap_or(0);
        expected = v.wrapping_add(1).max(1);
        // __ptr_ring_discard_one.
        let next = head + 1;
        if next - tail >= batch || next >= size {
            for slot in slots[tail..next].iter().rev() {
                slot.store(0, Ordering::Release);
            }
            tail = next;
        }
        head = if next >= size {
            tail = 0;
            0
        } else {
            next
        };
        delivered += 1;
        for i in 0..work {
            std::hint::black_box(i);
        }
        if stops {
            // __tun_wake_queue.
            if slots[head].load(Ordering::Acquire) == 0 {
                wake(&mut cons_cnt, &mut wakes);
            } else if shared.stopped.0.load(Ordering::Acquire) {
                cons_cnt += 1;
                if cons_cnt >= threshold {
                    wake(&mut cons_cnt, &mut wakes);
                }
            }
        }
        if delivered.is_multiple_of(1024) && shared.done.0.load(Ordering::Relaxed) {
            break;
        }
    }
    (delivered, wakes, missing)
}

/// The first two CPUs this process may run on, if it has two.
fn two_cpus() -> Option<(usize, usize)> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    let mut cpus = (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false));
    Some((cpus.next()?, cpus.next()?))
}

fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok()
        && let Err(err) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
    {
        log::warn!("could not pin a live thread to CPU {cpu}: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::X86_64_BATCH;

    #[test]
    fn every_policy_moves_items() {
        for policy in Policy::DEFAULTS {
            let r = run(
                &LiveConfig {
                    ring_size: 256,
                    cache_batch: X86_64_BATCH,
                    duration: Duration::from_millis(100),
                    consumer_work: 0,
                },
                policy,
            )
            .unwrap();
            assert!(r.delivered > 1000, "{r:?}");
            // What the consumer saw go missing, against what the producer says it dropped.
            assert!(r.missing <= r.dropped, "{r:?}");
            if policy.stops() {
                assert_eq!(r.missing, 0, "a stopping policy lost an item: {r:?}");
            } else {
                assert_eq!(r.stops, 0);
            }
        }
    }
}
