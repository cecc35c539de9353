#!/usr/bin/env bash
# Builds inboxd and runs the Python client's tests against it. Each test
# class starts its own daemon on a temp data dir and a free loopback port.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

"$python" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || { echo "the Python client needs Python 3.11 or newer" >&2; exit 1; }
(cd "$repo" && cargo build -p inbox-server --bin inboxd)
export INBOXD_BIN="${INBOXD_BIN:-$repo/target/debug/inboxd}"
cd "$here"
PYTHONPATH="$here/src" "$python" -m unittest discover -s tests -t . -v
