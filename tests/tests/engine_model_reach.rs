//! The `engine_model` rules checked on seeded random inputs of the longest
//! length the fuzzer makes, failing when a case they are about never
//! happened: restarts of every kind, replay after a checkpoint, sealed,
//! dropped and rewritten segments, multi-page syncs, injected failures.
//!
//! `ENGINE_MODEL_CASES` sets how many cases run (default 24) and
//! `ENGINE_MODEL_SEED` the first seed; the counts are printed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_operation_sequences_reach_every_case_the_model_checks() {
    let cases = env("ENGINE_MODEL_CASES", 24);
    let seed = env("ENGINE_MODEL_SEED", 1);
    for case in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed + case);
        let len = 4 * rng.gen_range(64..=1024);
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        inbox_tests::fuzzing::engine_model::check(&data);
    }
    let coverage = inbox_tests::fuzzing::engine_model::coverage();
    println!("engine_model on {cases} seeded cases from seed {seed}: {coverage}");
    coverage.assert_reached_everything();
}
