//! Any byte string given to the trace reader ends in records or an error: never a panic,
//! never unbounded memory. Events name devices of the header, and a file read to its end
//! has a trailer. Past the parser, the replay itself: whatever loads (whole or salvaged) is
//! replayed under every policy at the recorded ring size, which must neither panic nor
//! abort on an allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tap_probe_replay::policy::Policy;
use tap_probe_replay::ring::X86_64_BATCH;
use tap_probe_replay::salvage_recording;
use tap_probe_replay::sim::{SimConfig, simulate};
use tap_probe_trace::{Record, TraceReader};

fuzz_target!(|data: &[u8]| {
    let Ok(mut reader) = TraceReader::new(data) else {
        return;
    };
    let devices = reader.header().devices.len();
    for record in reader.by_ref() {
        match record {
            Ok(Record::Event(event)) => assert!(usize::from(event.device) < devices),
            Ok(Record::Lost { .. }) => {}
            Err(_) => return replay(data),
        }
    }
    assert!(reader.trailer().is_some(), "read to its end without a trailer");
    replay(data);
});

/// What `tap-probe replay --salvage FILE` does with the bytes.
fn replay(data: &[u8]) {
    let Ok(recording) = salvage_recording(data) else {
        return;
    };
    for stream in &recording.streams {
        let cfg = SimConfig {
            ring_size: stream.ring_size,
            cache_batch: X86_64_BATCH,
            qdisc_limit: stream.ring_size,
            plot_points: 16,
        };
        for policy in Policy::DEFAULTS {
            let m = simulate(&stream.ops, &cfg, policy);
            assert_eq!(
                m.delivered + m.ring_full_drops + m.qdisc_drops + u64::from(m.left_in_ring)
                    + m.left_in_qdisc,
                m.arrivals,
                "every arrival is delivered, dropped or still queued ({policy})"
            );
        }
    }
}
