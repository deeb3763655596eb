//! `cargo fuzz run sandbox_target` (scripts/fuzz): see `warren_fuzz::sandbox_target`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::sandbox_target(data));
