#!/usr/bin/env bash
# Opens a copy of the data directory kept by inboxd-keeping-restarts.sh with
# the given inboxd, waits until it serves, stops it, and prints what the
# open took (from its log): records replayed, and the milliseconds of each
# step. Every run starts from a fresh copy, so two binaries can be compared
# in turn on the same data.
#
#   INBOXD_KEEP_DIR=/tmp/keep bench/scripts/reopen-kept.sh target/release/inboxd
set -euo pipefail

keep=${INBOXD_KEEP_DIR:?set INBOXD_KEEP_DIR to the directory inboxd-keeping-restarts.sh wrote}
binary=${1:?usage: reopen-kept.sh INBOXD_BINARY}
[ -d "$keep/data/evt" ] || { echo "no kept data directory in $keep" >&2; exit 1; }
work="$keep/reopen"
rm -rf "$work"
cp -a "$keep/data" "$work"
sync
log="$keep/reopen.log"
"$binary" serve --data-dir "$work" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --token reopen --admin-token reopen-admin > /dev/null 2> "$log" &
pid=$!
for _ in $(seq 1 1200); do
    grep -q "inboxd serving" "$log" && break
    kill -0 "$pid" 2> /dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
done
kill -INT "$pid"
wait "$pid" || true
grep -E "inbox state recovered|inbox store opened|memory breakdown taken" "$log" \
    | grep -oE "(records|checkpoint_ms|replay_ms|logs_ms|state_ms|checks_ms|memory_ms)=[0-9]+" \
    | tr '\n' ' '
echo
rm -rf "$work"
