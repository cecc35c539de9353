//! How fast the `engine_model` checks run, without the fuzzer around them:
//! the committed corpus, then synthetic inputs that isolate the cost of a
//! case, of an operation and of each kind of restart. It also prints what
//! the corpus reaches (the model's coverage counts): run it after a fuzz
//! run with `FUZZ_JOBS` > 1, whose jobs' own counts libFuzzer does not
//! keep, and before the grown corpus is reset, to count that corpus.
//!
//! ```text
//! cargo run --release -p inbox-tests --example engine_model_speed
//! ```

use std::time::Instant;

use inbox_tests::fuzzing::engine_model::{check, coverage};

/// Runs `inputs` and prints cases, operations and restarts per second.
fn measure(name: &str, inputs: &[Vec<u8>]) {
    let before = coverage();
    let started = Instant::now();
    for input in inputs {
        check(input);
    }
    let secs = started.elapsed().as_secs_f64();
    let after = coverage();
    let restarts = (after.clean_restarts + after.kill_restarts + after.power_cut_restarts)
        - (before.clean_restarts + before.kill_restarts + before.power_cut_restarts);
    let ops = after.operations - before.operations;
    println!(
        "{name:<28} {:>5} cases {:>7.1} cases/s {:>9.0} operations/s {:>7.0} restarts/s ({:.2} s; {} operations, {restarts} restarts)",
        inputs.len(),
        inputs.len() as f64 / secs,
        ops as f64 / secs,
        restarts as f64 / secs,
        secs,
        ops,
    );
}

/// An input of `n` copies of one 4-byte operation.
fn repeated(op: [u8; 4], n: usize) -> Vec<u8> {
    op.iter().copied().cycle().take(4 * n).collect()
}

fn main() {
    let corpus = inbox_tests::fuzzing::corpus("engine_model");
    measure("corpus", &corpus);
    println!("corpus reach: {}", coverage());
    // One join per case: what opening a case's engine on a fresh
    // directory, one restart, and removing it cost.
    let bare: Vec<Vec<u8>> = (0..200).map(|_| vec![0, 0, 0, 0]).collect();
    measure("one join per case", &bare);
    // Joins first, so the sends are accepted; then only sends (op 3:
    // conversation c[1], sender c[2], key and size from c[3], varied).
    let sends: Vec<Vec<u8>> = (0..20u8)
        .map(|k| {
            let mut input = Vec::new();
            for uid in 0..4u8 {
                input.extend([0, 0, uid, 0]);
            }
            for i in 0..200u8 {
                input.extend([3, 0, i % 4, k.wrapping_mul(31).wrapping_add(i)]);
            }
            input
        })
        .collect();
    measure("200 sends per case", &sends);
    // Op 12 with c[1] % 3 = 0, 1, 2: clean, kill and power-cut restarts.
    for (name, how) in [
        ("clean restarts", 0u8),
        ("kill restarts", 1),
        ("power-cut restarts", 2),
    ] {
        let inputs: Vec<Vec<u8>> = (0..10).map(|_| repeated([12, how, 7, 9], 20)).collect();
        measure(name, &inputs);
    }
}
