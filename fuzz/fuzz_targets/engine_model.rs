#![no_main]
//! Operation sequences against the engine with fault-injecting storage;
//! see `inbox_tests::fuzzing::engine_model`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    inbox_tests::fuzzing::engine_model::check(data);
});
