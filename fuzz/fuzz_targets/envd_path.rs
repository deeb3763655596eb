//! `cargo fuzz run envd_path` (scripts/fuzz): see `warren_fuzz::envd_path`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::envd_path(data));
