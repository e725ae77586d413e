//! Any byte string given to the trace reader ends in records or an error: never a panic,
//! never unbounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = tap_probe::trace::TraceReader::new(data) {
        for record in reader {
            if record.is_err() {
                break;
            }
        }
    }
    let _ = tap_probe::model::load_recording(data);
});
