//! The format round-trips, and every way a file can be wrong is an error at its offset.

use super::*;

fn header() -> Header {
    Header {
        kernel_release: "6.18.0-test".to_owned(),
        backend: "tracepoint".to_owned(),
        start_ns: 42,
        devices: vec![
            DeviceInfo {
                netns: 4_026_531_840,
                ifindex: 7,
                queues: 1,
                ring_size: 500,
                name: "tap0".to_owned(),
            },
            DeviceInfo {
                netns: 4_026_532_000,
                ifindex: 3,
                queues: 4,
                ring_size: 1000,
                name: "vnet1".to_owned(),
            },
        ],
    }
}

const KINDS: [EventKind; 7] = [
    EventKind::Enqueued,
    EventKind::DroppedFullRing,
    EventKind::Busy,
    EventKind::Consumed,
    EventKind::QueueStop,
    EventKind::QueueWake,
    EventKind::DroppedOther,
];

fn events(n: u64) -> Vec<Event> {
    (0..n)
        .map(|i| Event {
            ts_ns: 1000 + i * 7,
            device: u16::try_from(i % 2).unwrap(),
            queue: u16::try_from(i % 3).unwrap(),
            cpu: u16::try_from(i % 2).unwrap(),
            kind: KINDS[usize::try_from(i).unwrap() % KINDS.len()],
            reason: u32::try_from(i % 5).unwrap(),
        })
        .collect()
}

/// A valid file with `n` events and one lost note after the first.
pub(crate) fn sample(n: u64) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    for (i, e) in events(n).iter().enumerate() {
        w.event(e).unwrap();
        if i == 0 {
            w.lost(e.ts_ns, 3).unwrap();
        }
    }
    w.finish().unwrap().0
}

fn read_all(bytes: &[u8]) -> Result<(Header, Vec<Record>, Trailer), TraceError> {
    let mut r = TraceReader::new(bytes)?;
    let mut recs = Vec::new();
    for rec in r.by_ref() {
        recs.push(rec?);
    }
    let t = *r.trailer().expect("iterator ended without a trailer");
    Ok((r.header().clone(), recs, t))
}

#[test]
fn round_trip() {
    let bytes = sample(100_000);
    let (h, recs, t) = read_all(&bytes).unwrap();
    assert_eq!(h, header());
    let evs: Vec<Event> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => Some(*e),
            Record::Lost { .. } => None,
        })
        .collect();
    assert_eq!(evs, events(100_000));
    assert_eq!(
        recs[1],
        Record::Lost {
            ts_ns: 1000,
            count: 3
        }
    );
    assert_eq!(t.events, 100_000);
    assert_eq!(t.lost, 3);
    assert_eq!(t.counts.iter().sum::<u64>(), 100_000);
    assert_eq!(t.count(EventKind::Enqueued), 100_000 / 7 + 1);
}

/// The fuzzing seed was written by a separate script from `docs/trace-format.md` alone.
#[test]
fn independently_written_seed_parses() {
    let (h, recs, t) = read_all(include_bytes!(
        "../../tap-probe/fuzz/seeds/trace_reader/small.trace"
    ))
    .unwrap();
    assert_eq!(h.kernel_release, "6.18.0");
    assert_eq!(h.devices[0].name, "tap0");
    assert_eq!(h.devices[0].ring_size, 500);
    assert_eq!(recs.len(), 10);
    assert_eq!(
        recs[3],
        Record::Lost {
            ts_ns: 2025,
            count: 4
        }
    );
    assert_eq!((t.events, t.lost), (9, 4));
    assert_eq!(t.count(EventKind::Consumed), 2);
}

#[test]
fn empty_recording_round_trips() {
    let bytes = sample(0);
    let (_, recs, t) = read_all(&bytes).unwrap();
    assert!(recs.is_empty());
    assert_eq!(t.events, 0);
}

fn err(bytes: &[u8]) -> String {
    read_all(bytes).unwrap_err().to_string()
}

#[test]
fn truncated_files_name_the_offset() {
    let bytes = sample(10);
    // Cut inside the third event record: the header is 14 + body bytes.
    let body = u32::from_le_bytes(bytes[10..14].try_into().unwrap()) as usize;
    let first = 14 + body;
    let third = first + 22 + 18 + 22;
    let e = err(&bytes[..third + 5]);
    assert_eq!(e, format!("truncated record at byte {third}"));
    // Cut right after a record: no trailer.
    let e = err(&bytes[..third]);
    assert!(e.contains(&format!("at byte {third}")), "{e}");
    assert!(e.contains("without a trailer"), "{e}");
    // Cut inside the header and inside the checksum.
    assert!(err(&bytes[..9]).starts_with("truncated header (version) at byte 8"));
    assert!(err(&bytes[..20]).starts_with("truncated header at byte 14"));
    assert!(err(&bytes[..bytes.len() - 2]).starts_with("truncated trailer"));
    // Every prefix fails cleanly.
    for cut in 0..bytes.len() {
        assert!(
            read_all(&bytes[..cut]).is_err(),
            "prefix {cut} read as valid"
        );
    }
}

/// Every cut after the header, salvaged: exactly the whole records before the cut, and the
/// offset where the last of them ends.
#[test]
fn a_cut_file_is_salvaged_up_to_its_last_whole_record() {
    let bytes = sample(10);
    let (_, all, _) = read_all(&bytes).unwrap();
    let body = u32::from_le_bytes(bytes[10..14].try_into().unwrap()) as usize;
    let first = 14 + body;
    // Where each record ends: one lost note (18 bytes) after the first event (22 each).
    let mut ends = vec![first];
    for (i, _) in all.iter().enumerate() {
        let len = if i == 1 { 18 } else { 22 };
        ends.push(ends[i] + len);
    }
    for cut in first..bytes.len() {
        let mut r = TraceReader::new(&bytes[..cut]).unwrap().salvage();
        let recs: Vec<Record> = r.by_ref().map(Result::unwrap).collect();
        let whole = ends.iter().rposition(|&end| end <= cut).unwrap();
        assert_eq!(recs, all[..whole], "cut at {cut}");
        assert_eq!(r.cut(), Some(ends[whole] as u64), "cut at {cut}");
        assert!(r.trailer().is_none());
    }
    // A complete file has no cut; a corrupt one is still an error.
    let mut r = TraceReader::new(bytes.as_slice()).unwrap().salvage();
    assert_eq!(r.by_ref().count(), all.len());
    assert_eq!(r.cut(), None);
    assert!(r.trailer().is_some());
    let mut bad = bytes.clone();
    bad[first] = REC_EVENT;
    bad[first + 1] = 3;
    let mut r = TraceReader::new(bad.as_slice()).unwrap().salvage();
    assert!(
        r.any(|rec| rec.is_err()),
        "a wrong length is corruption, not a cut"
    );
}

/// A ring of no entries, or of more than a model takes, is refused as `--ring-size` and a
/// synthetic workload's `ring=` refuse it ([`crate::RingSize`]).
#[test]
fn an_absurd_ring_size_is_refused() {
    let mut h = header();
    for size in [u32::MAX, MAX_RING_SIZE + 1, 0] {
        h.devices[1].ring_size = size;
        let bytes = TraceWriter::new(Vec::new(), &h)
            .unwrap()
            .finish()
            .unwrap()
            .0;
        let e = TraceReader::new(bytes.as_slice())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!(
                "device ring size {size} is not in 1..={MAX_RING_SIZE}"
            )),
            "{e}"
        );
    }
    h.devices[1].ring_size = MAX_RING_SIZE;
    let bytes = TraceWriter::new(Vec::new(), &h)
        .unwrap()
        .finish()
        .unwrap()
        .0;
    assert!(TraceReader::new(bytes.as_slice()).is_ok());
}

#[test]
fn newer_version_and_bad_magic() {
    let mut bytes = sample(3);
    bytes[8] = 9;
    assert_eq!(
        err(&bytes),
        "unsupported format version 9 at byte 8 (this tap-probe reads 1)"
    );
    bytes[0] = b'X';
    assert!(err(&bytes).contains("bad magic at byte 0"));
}

#[test]
fn corruption_is_detected() {
    let clean = sample(50);
    let body = u32::from_le_bytes(clean[10..14].try_into().unwrap()) as usize;
    let first = 14 + body;
    // A flipped timestamp bit passes every structural check but not the checksum.
    let mut bytes = clean.clone();
    bytes[first + 3] ^= 0x10;
    let e = err(&bytes);
    assert!(e.starts_with("checksum mismatch at byte"), "{e}");
    // An unknown event kind.
    let mut bytes = clean.clone();
    bytes[first + 2 + 14] = 99;
    assert_eq!(
        err(&bytes),
        format!("corrupt trace at byte {first}: unknown event kind 99")
    );
    // A device index outside the table.
    let mut bytes = clean.clone();
    bytes[first + 2 + 8] = 5;
    assert!(err(&bytes).contains("event for device 5"));
    // A wrong record length.
    let mut bytes = clean.clone();
    bytes[first + 1] = 21;
    assert!(err(&bytes).contains("has length 21, expected 20"));
    // Garbage after the trailer.
    let mut bytes = clean;
    let end = bytes.len() as u64;
    bytes.push(0);
    assert_eq!(
        err(&bytes),
        format!("corrupt trace at byte {end}: data after the trailer")
    );
}

#[test]
fn unknown_record_types_are_skipped() {
    let clean = sample(4);
    let body = u32::from_le_bytes(clean[10..14].try_into().unwrap()) as usize;
    let first = 14 + body;
    // Rebuild the file with an unknown record (type 9, 3 bytes) and a fresh checksum.
    let mut bytes = clean[..first].to_vec();
    bytes.extend_from_slice(&[9, 3, 1, 2, 3]);
    bytes.extend_from_slice(&clean[first..clean.len() - 4]);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let (_, recs, _) = read_all(&bytes).unwrap();
    assert_eq!(recs.len(), 5);
}

/// Deterministic mutations of a valid file (bit flips, cuts, splices, length bytes):
/// the reader returns an error or records, never panics, and stays bounded.
#[test]
fn mutated_files_never_panic() {
    let clean = sample(40);
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let pick = |r: u64, n: usize| usize::try_from(r % n as u64).unwrap();
    for _ in 0..20_000 {
        let mut bytes = clean.clone();
        for _ in 0..=(next() % 4) {
            let at = pick(next(), bytes.len());
            match next() % 5 {
                0 => bytes[at] ^= 1 << (next() % 8),
                1 => bytes[at] = u8::try_from(next() & 0xff).unwrap(),
                2 => bytes.truncate(at),
                3 => {
                    let n = pick(next(), 16);
                    let src: Vec<u8> = bytes[at..(at + n).min(bytes.len())].to_vec();
                    bytes.splice(at..at, src);
                }
                _ => bytes[at] = 0xff,
            }
            if bytes.is_empty() {
                break;
            }
        }
        let _ = read_all(&bytes);
    }
}

/// A disk that takes `room` bytes and then fails with "no space left", like a full
/// filesystem: partial writes included.
struct FullDisk {
    bytes: Vec<u8>,
    room: usize,
}

impl std::io::Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.room - self.bytes.len());
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
        }
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whatever byte the disk fills up at: cutting back, truncating and finishing gives a
/// complete file whose trailer counts exactly the events in it, and whose lost notes count
/// the ones the cut dropped.
#[test]
fn a_full_disk_is_cut_back_to_a_whole_record_and_finished() {
    let all = events(10_000);
    let header_len = TraceWriter::new(Vec::new(), &header()).unwrap().written;
    for room in (usize::try_from(header_len).unwrap()..3000 * 22).step_by(997) {
        let mut w = TraceWriter::new(
            FullDisk {
                bytes: Vec::new(),
                room,
            },
            &header(),
        )
        .unwrap();
        let mut failed = None;
        for (i, e) in all.iter().enumerate() {
            if let Err(err) = w.event(e) {
                failed = Some((i, err));
                break;
            }
        }
        let (i, err) = failed.expect("the disk fills up");
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        let cut = w.cut_back();
        // Truncate where the last whole record ends; the space after it is free again.
        let disk = w.get_mut();
        assert!(cut.offset <= disk.bytes.len() as u64);
        disk.bytes.truncate(usize::try_from(cut.offset).unwrap());
        disk.room = disk.bytes.len() + 200;
        // The event that failed was appended before the write that failed.
        let written = i as u64 + 1 - cut.events;
        w.lost(0, cut.events + 1).unwrap();
        let (disk, t) = w.finish().unwrap();
        let (_, recs, trailer) = read_all(&disk.bytes).unwrap();
        let read: Vec<Event> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Event(e) => Some(*e),
                Record::Lost { .. } => None,
            })
            .collect();
        assert_eq!(
            read,
            all[..usize::try_from(written).unwrap()],
            "room {room}"
        );
        assert_eq!(trailer, t);
        assert_eq!(trailer.events, written);
        let lost: u64 = recs
            .iter()
            .map(|r| match r {
                Record::Lost { count, .. } => *count,
                Record::Event(_) => 0,
            })
            .sum();
        assert_eq!(trailer.lost, lost, "room {room}");
        assert!(lost > cut.events);
    }
}

/// A disk that fills up inside the trailer: cut back to the records before it.
#[test]
fn a_trailer_cut_short_is_cut_back() {
    let mut w = TraceWriter::new(
        FullDisk {
            bytes: Vec::new(),
            room: 1 << 20,
        },
        &header(),
    )
    .unwrap();
    for e in events(10) {
        w.event(&e).unwrap();
    }
    w.get_mut().room = usize::try_from(w.written).unwrap() + 10 * 22 + 40;
    assert!(w.end().is_err());
    let cut = w.cut_back();
    assert_eq!(cut.events, 0, "the events reached the disk whole");
    let disk = w.get_mut();
    disk.bytes.truncate(usize::try_from(cut.offset).unwrap());
    let mut r = TraceReader::new(disk.bytes.as_slice()).unwrap().salvage();
    assert_eq!(r.by_ref().count(), 10);
    assert_eq!(r.cut(), Some(cut.offset));
}
