//! `cargo fuzz run build_steps` (scripts/fuzz): see `warren_fuzz::build_steps`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::build_steps(data));
