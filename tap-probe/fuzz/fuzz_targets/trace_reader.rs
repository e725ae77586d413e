//! Any byte string given to the trace reader ends in records or an error: never a panic,
//! never unbounded memory. Events name devices of the header, and a file read to its end
//! has a trailer.
#![no_main]

use libfuzzer_sys::fuzz_target;
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
            Err(_) => return,
        }
    }
    assert!(reader.trailer().is_some(), "read to its end without a trailer");
});
