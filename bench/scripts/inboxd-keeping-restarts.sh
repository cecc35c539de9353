#!/usr/bin/env bash
# An inboxd for `inbox-bench --inboxd` that keeps what a restart starts
# from: each time the harness starts the daemon on a data directory that
# already holds `evt` segments (a restart after a kill, or a cold restart),
# the directory is first copied to $INBOXD_KEEP_DIR/data (the newest such
# start wins), and every start's log goes to $INBOXD_KEEP_DIR/inboxd.log.
# The log's `inbox state recovered` and `inbox store opened` lines say what
# the open took; `bench/scripts/reopen-kept.sh` opens the copy again.
#
#   INBOXD_KEEP_DIR=/tmp/keep target/release/inbox-bench \
#       --inboxd bench/scripts/inboxd-keeping-restarts.sh --full --systems inboxd
#
# INBOXD_BINARY names the daemon (default: target/release/inboxd beside
# this script's repository).
set -euo pipefail

keep=${INBOXD_KEEP_DIR:?set INBOXD_KEEP_DIR to a directory for the copy and the log}
here=$(cd "$(dirname "$0")/../.." && pwd)
binary=${INBOXD_BINARY:-$here/target/release/inboxd}
mkdir -p "$keep"
echo "=== $(date -u +%FT%T.%NZ) start: $*" >> "$keep/inboxd.log"

data=
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    if [ "${args[$i]}" = --data-dir ] && [ $((i + 1)) -lt ${#args[@]} ]; then
        data=${args[$((i + 1))]}
    fi
done
if [ "${1:-}" = serve ] && [ -n "$data" ] && compgen -G "$data/evt/*.seg" > /dev/null; then
    rm -rf "$keep/data"
    cp -a "$data" "$keep/data"
fi
exec "$binary" "$@" 2>> "$keep/inboxd.log"
