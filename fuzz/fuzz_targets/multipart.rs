//! `cargo fuzz run multipart` (scripts/fuzz): see `warren_fuzz::multipart`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::multipart(data));
