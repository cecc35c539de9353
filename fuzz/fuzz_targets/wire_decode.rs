#![no_main]
//! Arbitrary bytes into the frame and body decoders; see
//! `inbox_tests::fuzzing::wire_decode`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    inbox_tests::fuzzing::wire_decode::check(data);
});
