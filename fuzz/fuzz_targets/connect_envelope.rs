//! `cargo fuzz run connect_envelope` (scripts/fuzz): see `warren_fuzz::connect_envelope`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::connect_envelope(data));
