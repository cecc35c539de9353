#!/usr/bin/env bash
# Runs one fuzz target for a number of seconds on the stable toolchain.
#   fuzz/run.sh TARGET SECONDS
#   fuzz/run.sh TARGET cmin     minimize the corpus before committing it
#   fuzz/run.sh build           build every target (CI), with fuzz/Cargo.lock
#                               as committed (--locked)
# Installs cargo-fuzz when it is missing. New corpus entries land in
# fuzz/corpus/TARGET; crashes in fuzz/artifacts/TARGET. engine_model prints
# its coverage counts (restarts, replays, seals, drops, rewrites) to stderr
# every 1,000 cases.
#
# FUZZ_JOBS=N runs N fuzzing processes at once (libFuzzer's -fork=N),
# sharing the corpus; one per core is the useful most. libFuzzer drops the
# jobs' stderr, coverage counts included: count what the grown corpus
# reaches with `cargo run --release -p inbox-tests --example
# engine_model_speed`.
# FUZZ_SANITIZER picks cargo-fuzz's sanitizer. The byte-level targets run
# under AddressSanitizer by default. engine_model defaults to none: its
# checks are the model's own assertions over safe, bounds-checked Rust; the
# engine's unsafe code is file mappings and slices read from them, memory
# that ASan does not track (it is not heap), and flock/fallocate calls.
# ASan costs engine_model about half its executions.
# `fuzz/run.sh build` always builds with ASan.
set -euo pipefail
cd "$(dirname "$0")"

usage="usage: fuzz/run.sh TARGET SECONDS|cmin, or fuzz/run.sh build"
target=${1:?$usage}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
if [ "$target" = build ]; then
    # `cargo fuzz build` takes no --locked: this fails, naming what is
    # missing, when fuzz/Cargo.lock is not current, instead of letting the
    # build rewrite it.
    cargo metadata --locked --format-version 1 >/dev/null
    exec cargo fuzz build
fi
seconds=${2:?$usage}
default_sanitizer=address
if [ "$target" = engine_model ]; then
    default_sanitizer=none
fi
sanitizer=${FUZZ_SANITIZER:-$default_sanitizer}
jobs=${FUZZ_JOBS:-1}
mkdir -p "corpus/$target"
if [ "$seconds" = cmin ]; then
    exec cargo fuzz cmin --sanitizer "$sanitizer" "$target" "corpus/$target"
fi
fork=()
if [ "$jobs" -gt 1 ]; then
    fork=(-fork="$jobs")
fi
exec cargo fuzz run --sanitizer "$sanitizer" "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 -max_len=4096 "${fork[@]}"
