#!/usr/bin/env bash
# Runs one fuzz target for a number of seconds on the stable toolchain.
#   fuzz/run.sh TARGET SECONDS
# Installs cargo-fuzz when it is missing. New corpus entries land in
# fuzz/corpus/TARGET; crashes in fuzz/artifacts/TARGET. Afterwards, minimize
# the corpus with `fuzz/run.sh TARGET cmin` before committing it.
set -euo pipefail
cd "$(dirname "$0")"

target=${1:?usage: fuzz/run.sh TARGET SECONDS|cmin}
seconds=${2:?usage: fuzz/run.sh TARGET SECONDS|cmin}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
mkdir -p "corpus/$target"
if [ "$seconds" = cmin ]; then
    exec cargo fuzz cmin "$target" "corpus/$target"
fi
exec cargo fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 -max_len=4096
