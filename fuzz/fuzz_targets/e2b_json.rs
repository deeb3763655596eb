//! `cargo fuzz run e2b_json` (scripts/fuzz): see `warren_fuzz::e2b_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::e2b_json(data));
