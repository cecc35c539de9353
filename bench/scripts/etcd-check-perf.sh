#!/usr/bin/env bash
# etcd's own load check against three members on loopback, started as
# inbox-bench starts them (default durability, private directories and
# free ports), for scale beside `inbox-bench --cluster 3`:
#
#   bench/scripts/etcd-check-perf.sh [LOAD]   # s, m, l or xl; default l
#
# `etcdctl check perf` writes single keys for 60 s and prints the
# throughput and latency it saw. DATA_DIR picks where the members'
# directories go (default: the system temp dir). The members stop when it
# ends.
set -euo pipefail

load=${1:-l}
command -v etcd >/dev/null && command -v etcdctl >/dev/null || {
    echo "etcd and etcdctl are missing: bench/scripts/install-etcd.sh installs them" >&2
    exit 1
}
dir=$(mktemp -d "${DATA_DIR:-${TMPDIR:-/tmp}}/etcd-perf-XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
client=() peer=()
for i in 1 2 3; do
    client+=("$(free_port)")
    peer+=("$(free_port)")
done
cluster="m1=http://127.0.0.1:${peer[0]},m2=http://127.0.0.1:${peer[1]},m3=http://127.0.0.1:${peer[2]}"
for i in 0 1 2; do
    etcd --name "m$((i + 1))" --data-dir "$dir/m$((i + 1))" \
        --listen-client-urls "http://127.0.0.1:${client[i]}" \
        --advertise-client-urls "http://127.0.0.1:${client[i]}" \
        --listen-peer-urls "http://127.0.0.1:${peer[i]}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${peer[i]}" \
        --initial-cluster "$cluster" --initial-cluster-state new \
        --initial-cluster-token "perf-$$" --logger zap --log-level warn \
        >"$dir/m$((i + 1)).log" 2>&1 &
    pids+=("$!")
done
endpoints="http://127.0.0.1:${client[0]},http://127.0.0.1:${client[1]},http://127.0.0.1:${client[2]}"
for _ in $(seq 1 600); do
    if ETCDCTL_API=3 etcdctl --endpoints="$endpoints" endpoint health >/dev/null 2>&1; then
        break
    fi
    sleep 0.1
done
etcd --version | head -n 1
ETCDCTL_API=3 etcdctl --endpoints="$endpoints" check perf --load="$load"
