//! The split virtqueue in this process's memory: where its parts lie, the mapping that
//! holds them, and the receive ring seen from the driver's side.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering, fence};

use anyhow::{Context as _, Result, anyhow, bail};
use nix::errno::Errno;

use super::uapi::{
    MAX_QUEUE_SIZE, NUM_BUFFERS_OFFSET, PAGE, VNET_HDR_LEN, VRING_AVAIL_F_NO_INTERRUPT,
    VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY, VringDesc, VringUsedElem,
};

const MIN_BUFFER_LEN: u32 = 64;
const MAX_BUFFER_LEN: u32 = 65_536;

// The ring is shared with the kernel in its byte order; virtio 1.0 rings are little endian.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the vring is written in native byte order, which virtio 1.0 requires to be little endian"
);

/// Where the parts of the split virtqueue and the buffers lie in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) desc: usize,
    pub(super) avail: usize,
    pub(super) used: usize,
    pub(super) buffers: usize,
    pub(super) len: usize,
}

impl Layout {
    /// The legacy virtio layout (descriptors, then the available ring, then the used ring
    /// on the next page), followed by the buffers on the next page.
    pub(super) fn new(size: u16, buffer_len: u32) -> Result<Self> {
        if !size.is_power_of_two() || !(2..=MAX_QUEUE_SIZE).contains(&size) {
            bail!("the queue size must be a power of two from 2 to {MAX_QUEUE_SIZE}, got {size}");
        }
        if !(MIN_BUFFER_LEN..=MAX_BUFFER_LEN).contains(&buffer_len) {
            bail!(
                "the buffer length must be {MIN_BUFFER_LEN} to {MAX_BUFFER_LEN} bytes, got {buffer_len}"
            );
        }
        let n = usize::from(size);
        let desc = 0;
        let avail = desc + n * size_of::<VringDesc>();
        // flags, idx, ring[n], used_event
        let avail_len = 2 + 2 + 2 * n + 2;
        let used = (avail + avail_len).next_multiple_of(PAGE);
        // flags, idx, ring[n], avail_event
        let used_len = 2 + 2 + n * size_of::<VringUsedElem>() + 2;
        let buffers = (used + used_len).next_multiple_of(PAGE);
        let len = (buffers + n * usize::try_from(buffer_len)?).next_multiple_of(PAGE);
        Ok(Self {
            desc,
            avail,
            used,
            buffers,
            len,
        })
    }
}

/// An anonymous read-write mapping, unmapped on drop.
pub(super) struct Arena {
    pub(super) base: NonNull<u8>,
    pub(super) len: usize,
}

// SAFETY: the mapping is owned by this value alone and has no thread affinity; sending it
// to another thread moves that ownership.
unsafe impl Send for Arena {}

impl Arena {
    pub(super) fn new(len: usize) -> Result<Self> {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Errno::last())
                .with_context(|| format!("cannot map {len} bytes for the vhost-net ring"));
        }
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| anyhow!("mmap returned a null mapping"))?;
        Ok(Self { base, len })
    }

    pub(super) fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// A pointer `offset` bytes into the mapping, for a `T` that fits there.
    pub(super) fn at<T>(&self, offset: usize) -> *mut T {
        debug_assert!(offset + size_of::<T>() <= self.len);
        debug_assert!(offset.is_multiple_of(align_of::<T>()));
        // SAFETY: callers only pass offsets computed from the Layout, inside the mapping.
        unsafe { self.base.as_ptr().add(offset).cast() }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: base/len is exactly the mapping made in Arena::new, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// What one [`RxRing::take`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Taken {
    pub(super) frames: u64,
    pub(super) bytes: u64,
    pub(super) buffers: u64,
}

/// The receive virtqueue seen from the driver side. Descriptor `i` always points at
/// buffer `i`; only their order in the available ring changes.
pub(super) struct RxRing {
    pub(super) arena: Arena,
    pub(super) layout: Layout,
    pub(super) size: u16,
    pub(super) buffer_len: u32,
    /// Our copy of `avail->idx`: buffers posted so far, modulo 2^16.
    pub(super) next_avail: u16,
    /// The next used entry to read.
    pub(super) next_used: u16,
    /// Descriptors the device owns (posted, not yet returned).
    pub(super) with_device: Vec<bool>,
    /// Descriptors returned and waiting to be posted again, oldest first.
    pub(super) to_post: VecDeque<u16>,
    /// Buffers still to come of a frame that spans several (mergeable buffers).
    pub(super) frame_rest: u16,
}

impl RxRing {
    pub(super) fn new(size: u16, buffer_len: u32) -> Result<Self> {
        let layout = Layout::new(size, buffer_len)?;
        let arena = Arena::new(layout.len)?;
        for i in 0..size {
            let desc = VringDesc {
                addr: arena.addr() + (layout.buffers + usize::from(i) * buffer_len as usize) as u64,
                len: buffer_len,
                flags: VRING_DESC_F_WRITE,
                next: 0,
            };
            // SAFETY: descriptor i lies inside the mapping (Layout), nobody else uses it
            // before the ring is handed to the device.
            unsafe {
                arena
                    .at::<VringDesc>(layout.desc + usize::from(i) * size_of::<VringDesc>())
                    .write(desc);
            }
        }
        Ok(Self {
            arena,
            layout,
            size,
            buffer_len,
            next_avail: 0,
            next_used: 0,
            with_device: vec![false; usize::from(size)],
            to_post: (0..size).collect(),
            frame_rest: 0,
        })
    }

    /// The memory region to register: (address, length).
    pub(super) fn region(&self) -> (u64, u64) {
        (self.arena.addr(), self.layout.len as u64)
    }

    /// (descriptor table, available ring, used ring) addresses.
    pub(super) fn addresses(&self) -> (u64, u64, u64) {
        let base = self.arena.addr();
        (
            base + self.layout.desc as u64,
            base + self.layout.avail as u64,
            base + self.layout.used as u64,
        )
    }

    pub(super) fn u16_at(&self, offset: usize) -> &AtomicU16 {
        // SAFETY: the offset is a 2-byte aligned u16 field of the ring inside the mapping,
        // which lives as long as `self`; the kernel accesses it concurrently, hence atomic.
        unsafe { AtomicU16::from_ptr(self.arena.at::<u16>(offset)) }
    }

    pub(super) fn avail_flags(&self) -> &AtomicU16 {
        self.u16_at(self.layout.avail)
    }

    pub(super) fn avail_idx(&self) -> &AtomicU16 {
        self.u16_at(self.layout.avail + 2)
    }

    pub(super) fn used_flags(&self) -> &AtomicU16 {
        self.u16_at(self.layout.used)
    }

    pub(super) fn used_idx(&self) -> &AtomicU16 {
        self.u16_at(self.layout.used + 2)
    }

    pub(super) fn slot(&self, idx: u16) -> usize {
        usize::from(idx & (self.size - 1))
    }

    /// Descriptors returned by the device and not yet posted again.
    pub(super) fn waiting(&self) -> usize {
        self.to_post.len()
    }

    /// Posts up to `max` waiting descriptors; returns how many.
    pub(super) fn post(&mut self, max: usize) -> usize {
        let n = self.to_post.len().min(max);
        if n == 0 {
            return 0;
        }
        for id in self.to_post.drain(..n) {
            let offset = self.layout.avail + 4 + 2 * usize::from(self.next_avail & (self.size - 1));
            // SAFETY: a slot of the available ring inside the mapping; the device reads
            // it only after the index store below publishes it.
            unsafe { self.arena.at::<u16>(offset).write_volatile(id) };
            self.with_device[usize::from(id)] = true;
            self.next_avail = self.next_avail.wrapping_add(1);
        }
        // Publishes the ring entries (vhost_get_avail_idx reads the index, then smp_rmb).
        self.avail_idx().store(self.next_avail, Ordering::Release);
        n
    }

    /// Whether the device asked to be kicked for new buffers.
    pub(super) fn device_wants_kick(&self) -> bool {
        // Paired with the smp_mb in vhost_enable_notify: either it sees our new index or
        // we see the flag it cleared.
        fence(Ordering::SeqCst);
        self.used_flags().load(Ordering::Relaxed) & VRING_USED_F_NO_NOTIFY == 0
    }

    pub(super) fn set_interrupts(&self, enabled: bool) {
        let flags = if enabled {
            0
        } else {
            VRING_AVAIL_F_NO_INTERRUPT
        };
        self.avail_flags().store(flags, Ordering::Relaxed);
    }

    pub(super) fn has_used(&self) -> bool {
        self.used_idx().load(Ordering::Acquire) != self.next_used
    }

    /// Reads the used entries the device published, at most `max_frames` frames' worth,
    /// and queues their descriptors for posting.
    pub(super) fn take(
        &mut self,
        max_frames: u64,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> Result<Taken> {
        // Paired with vhost's smp_wmb between the used entries and the index.
        let used_idx = self.used_idx().load(Ordering::Acquire);
        let mut taken = Taken::default();
        while self.next_used != used_idx {
            let offset =
                self.layout.used + 4 + self.slot(self.next_used) * size_of::<VringUsedElem>();
            // SAFETY: a used ring slot inside the mapping, published by the index above.
            let elem = unsafe { self.arena.at::<VringUsedElem>(offset).read_volatile() };
            let id = u16::try_from(elem.id)
                .ok()
                .filter(|id| *id < self.size)
                .ok_or_else(|| {
                    anyhow!(
                        "vhost-net returned descriptor {} of a {}-entry ring: the ring is corrupt",
                        elem.id,
                        self.size
                    )
                })?;
            if !self.with_device[usize::from(id)] {
                bail!(
                    "vhost-net returned descriptor {id}, which it did not own: the ring is corrupt"
                );
            }
            if elem.len > self.buffer_len {
                bail!(
                    "vhost-net wrote {} bytes into a {}-byte buffer: the ring is corrupt",
                    elem.len,
                    self.buffer_len
                );
            }
            let len = elem.len as usize;
            if self.frame_rest == 0 {
                if taken.frames >= max_frames {
                    break;
                }
                let buffer = self.buffer(id, len);
                if len < VNET_HDR_LEN {
                    bail!(
                        "vhost-net returned a {len}-byte buffer, shorter than the virtio-net header"
                    );
                }
                let num_buffers = u16::from_le_bytes([
                    buffer[NUM_BUFFERS_OFFSET],
                    buffer[NUM_BUFFERS_OFFSET + 1],
                ]);
                if num_buffers == 0 {
                    bail!("vhost-net wrote a virtio-net header with num_buffers 0");
                }
                on_frame(&buffer[VNET_HDR_LEN..]);
                taken.frames += 1;
                taken.bytes += (len - VNET_HDR_LEN) as u64;
                self.frame_rest = num_buffers - 1;
            } else {
                taken.bytes += len as u64;
                self.frame_rest -= 1;
            }
            self.with_device[usize::from(id)] = false;
            self.to_post.push_back(id);
            self.next_used = self.next_used.wrapping_add(1);
            taken.buffers += 1;
        }
        Ok(taken)
    }

    /// The first `len` bytes of buffer `id`.
    pub(super) fn buffer(&self, id: u16, len: usize) -> &[u8] {
        debug_assert!(len <= self.buffer_len as usize);
        let offset = self.layout.buffers + usize::from(id) * self.buffer_len as usize;
        // SAFETY: buffer `id` lies inside the mapping (Layout) and `len` is at most its
        // length; the device returned it and cannot write it again until we post it,
        // which needs `&mut self` while this borrow of `self` lives.
        unsafe { std::slice::from_raw_parts(self.arena.at::<u8>(offset), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_disjoint() {
        let l = Layout::new(256, 2048).unwrap();
        assert_eq!(l.avail, 256 * 16);
        assert_eq!(l.used % PAGE, 0);
        assert!(l.used >= l.avail + 6 + 2 * 256);
        assert!(l.buffers >= l.used + 6 + 8 * 256);
        assert_eq!(l.buffers % PAGE, 0);
        assert_eq!(l.len % PAGE, 0);
        assert!(l.len >= l.buffers + 256 * 2048);
        assert!(Layout::new(32_768, 65_536).is_ok());
    }

    #[test]
    fn layout_rejects_bad_shapes() {
        for (size, len) in [(0, 2048), (1, 2048), (300, 2048), (256, 10), (256, 70_000)] {
            assert!(Layout::new(size, len).is_err(), "{size} x {len}");
        }
    }

    /// A stand-in for vhost-net's receive side: fills posted buffers with frames whose
    /// payload is a sequence number, `per_frame` buffers per frame.
    struct FakeDevice {
        next_avail: u16,
        next_used: u16,
        seq: u64,
    }

    impl FakeDevice {
        fn fill(&mut self, ring: &RxRing, frames: usize, per_frame: u16) -> usize {
            let avail = ring.avail_idx().load(Ordering::Acquire);
            let mut done = 0;
            while done < frames && avail.wrapping_sub(self.next_avail) >= per_frame {
                for k in 0..per_frame {
                    let slot = ring.slot(self.next_avail);
                    let id = unsafe {
                        ring.arena
                            .at::<u16>(ring.layout.avail + 4 + 2 * slot)
                            .read_volatile()
                    };
                    self.next_avail = self.next_avail.wrapping_add(1);
                    let buf = ring.layout.buffers + usize::from(id) * ring.buffer_len as usize;
                    let len: u32 = if k == 0 {
                        let hdr = ring.arena.at::<u8>(buf);
                        unsafe {
                            std::ptr::write_bytes(hdr, 0, VNET_HDR_LEN);
                            hdr.add(NUM_BUFFERS_OFFSET)
                                .cast::<[u8; 2]>()
                                .write_unaligned(per_frame.to_le_bytes());
                            hdr.add(VNET_HDR_LEN)
                                .cast::<[u8; 8]>()
                                .write_unaligned(self.seq.to_be_bytes());
                        }
                        u32::try_from(VNET_HDR_LEN + 60).unwrap()
                    } else {
                        100
                    };
                    let used = ring.layout.used + 4 + ring.slot(self.next_used) * 8;
                    unsafe {
                        ring.arena
                            .at::<VringUsedElem>(used)
                            .write_volatile(VringUsedElem { id: id.into(), len });
                    }
                    self.next_used = self.next_used.wrapping_add(1);
                }
                self.seq += 1;
                done += 1;
            }
            ring.used_idx().store(self.next_used, Ordering::Release);
            done
        }
    }

    fn seq_of(frame: &[u8]) -> u64 {
        u64::from_be_bytes(frame[..8].try_into().unwrap())
    }

    #[test]
    fn recycles_across_index_wraparound() {
        let mut ring = RxRing::new(8, 256).unwrap();
        let mut dev = FakeDevice {
            next_avail: 0,
            next_used: 0,
            seq: 0,
        };
        assert_eq!(ring.post(usize::MAX), 8);
        let mut seen = Vec::new();
        let mut total = Taken::default();
        // 70,000 frames: both 16-bit indexes wrap.
        while total.frames < 70_000 {
            let filled = dev.fill(&ring, 5, 1);
            assert!(filled > 0);
            let t = ring.take(u64::MAX, &mut |f| seen.push(seq_of(f))).unwrap();
            total.frames += t.frames;
            total.bytes += t.bytes;
            ring.post(usize::MAX);
        }
        assert_eq!(total.frames, 70_000);
        assert_eq!(total.bytes, 70_000 * 60);
        assert!(seen.iter().copied().eq(0..70_000));
    }

    #[test]
    fn mergeable_frames_count_once() {
        let mut ring = RxRing::new(8, 256).unwrap();
        let mut dev = FakeDevice {
            next_avail: 0,
            next_used: 0,
            seq: 7,
        };
        ring.post(usize::MAX);
        assert_eq!(dev.fill(&ring, 2, 3), 2);
        let mut seen = Vec::new();
        let t = ring.take(u64::MAX, &mut |f| seen.push(seq_of(f))).unwrap();
        assert_eq!(
            t,
            Taken {
                frames: 2,
                bytes: 2 * (60 + 200),
                buffers: 6
            }
        );
        assert_eq!(seen, [7, 8]);
        assert_eq!(ring.waiting(), 6);
    }

    #[test]
    fn max_frames_leaves_the_rest_for_later() {
        let mut ring = RxRing::new(8, 256).unwrap();
        let mut dev = FakeDevice {
            next_avail: 0,
            next_used: 0,
            seq: 0,
        };
        ring.post(usize::MAX);
        dev.fill(&ring, 6, 1);
        let t = ring.take(4, &mut |_| {}).unwrap();
        assert_eq!(t.frames, 4);
        let t = ring.take(u64::MAX, &mut |_| {}).unwrap();
        assert_eq!(t.frames, 2);
    }

    #[test]
    fn rejects_corrupt_used_entries() {
        let mut ring = RxRing::new(8, 256).unwrap();
        ring.post(usize::MAX);
        let bad = |ring: &mut RxRing, elem: VringUsedElem| {
            let used = ring.layout.used + 4 + ring.slot(ring.next_used) * 8;
            unsafe { ring.arena.at::<VringUsedElem>(used).write_volatile(elem) };
            ring.used_idx()
                .store(ring.next_used.wrapping_add(1), Ordering::Release);
            ring.take(u64::MAX, &mut |_| {}).unwrap_err().to_string()
        };
        assert!(bad(&mut ring, VringUsedElem { id: 8, len: 20 }).contains("descriptor 8"));
        assert!(bad(&mut ring, VringUsedElem { id: 1, len: 300 }).contains("300 bytes"));
        // Descriptor 2 after the ring gave it back and before it was posted again.
        ring.with_device[2] = false;
        assert!(bad(&mut ring, VringUsedElem { id: 2, len: 20 }).contains("did not own"));
    }
}
