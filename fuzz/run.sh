#!/usr/bin/env bash
# Runs one fuzz target for a number of seconds on the stable toolchain.
#   fuzz/run.sh TARGET SECONDS
#   fuzz/run.sh TARGET cmin     minimize the corpus before committing it
#   fuzz/run.sh build           build every target (CI)
# Installs cargo-fuzz when it is missing. New corpus entries land in
# fuzz/corpus/TARGET; crashes in fuzz/artifacts/TARGET. engine_model prints
# its coverage counts (restarts, replays, seals, drops, rewrites) to stderr
# every 1,000 cases.
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
    exec cargo fuzz build
fi
seconds=${2:?$usage}
mkdir -p "corpus/$target"
if [ "$seconds" = cmin ]; then
    exec cargo fuzz cmin "$target" "corpus/$target"
fi
exec cargo fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 -max_len=4096
