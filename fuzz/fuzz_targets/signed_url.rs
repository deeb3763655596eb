//! `cargo fuzz run signed_url` (scripts/fuzz): see `warren_fuzz::signed_url`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::signed_url(data));
