#!/usr/bin/env bash
# Runs the Go client's `go vet` and tests against a real inboxd: the
# binary named by INBOXD_BIN, else target/debug/inboxd, else
# target/release/inboxd at the repository's root (the Rust tests build
# the debug one). Installs Debian's golang-go when `go` is missing. Fails,
# never skips, when there is no daemon binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

if ! command -v go >/dev/null 2>&1; then
    echo "go is missing: installing golang-go" >&2
    apt-get update && apt-get install -y golang-go
fi

if [[ -z "${INBOXD_BIN:-}" ]]; then
    for candidate in "$repo/target/debug/inboxd" "$repo/target/release/inboxd"; do
        if [[ -x "$candidate" ]]; then
            INBOXD_BIN="$candidate"
            break
        fi
    done
fi
if [[ -z "${INBOXD_BIN:-}" || ! -x "$INBOXD_BIN" ]]; then
    echo "error: no inboxd binary (INBOXD_BIN=${INBOXD_BIN:-unset}, nor target/debug/inboxd or" \
        "target/release/inboxd under $repo); build it with" \
        "\`cargo build -p inbox-server --bin inboxd\`" >&2
    exit 1
fi
export INBOXD_BIN

cd "$here"
go version
go vet ./...
# The tests start their own daemons on loopback; none skips.
go test -count=1 -timeout 10m ./...
