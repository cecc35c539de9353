#!/usr/bin/env bash
# An inboxd for `inbox-bench --inboxd` whose threads all run on one CPU
# (the last one, or $INBOXD_CPU), so that the connection worker and the
# sequencer wake each other on the same CPU. It measures what the
# cross-CPU wake-ups of a send cost; it is not a setting to deploy with
# (at 16 connections the harness shares that CPU with the daemon).
#
#   target/release/inbox-bench --inboxd bench/scripts/inboxd-on-one-cpu.sh \
#       --quick --seconds 5 --systems limit,inboxd --scenarios ingest --clients 1,16
#
# INBOXD_BINARY names the daemon (default: target/release/inboxd beside
# this script's repository).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
binary=${INBOXD_BINARY:-$here/target/release/inboxd}
cpu=${INBOXD_CPU:-$(($(nproc) - 1))}
exec taskset -c "$cpu" "$binary" "$@"
