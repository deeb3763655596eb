//! `cargo fuzz run template_spec` (scripts/fuzz): see `warren_fuzz::template_spec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| warren_fuzz::template_spec(data));
