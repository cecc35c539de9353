#![no_main]
//! Damaged segment directories go into recovery; see
//! `inbox_tests::fuzzing::segment_recover`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    inbox_tests::fuzzing::segment_recover::check(data);
});
