#![no_main]
//! Operation sequences against the engine with fault-injecting storage;
//! see `inbox_tests::fuzzing::engine_model`. Every 1,000 cases it prints
//! what the cases so far reached (restarts of each kind, replays after a
//! checkpoint, sealed, dropped and rewritten segments, injected failures).

use libfuzzer_sys::fuzz_target;

static PIN: std::sync::Once = std::sync::Once::new();

fuzz_target!(|data: &[u8]| {
    // Before the first engine starts its threads, so they inherit it.
    PIN.call_once(inbox_tests::fuzzing::pin_to_one_cpu);
    inbox_tests::fuzzing::engine_model::check(data);
    let coverage = inbox_tests::fuzzing::engine_model::coverage();
    if coverage.cases % 1000 == 0 {
        eprintln!("engine_model coverage: {coverage}");
    }
});
