#!/usr/bin/env bash
# Installs what the etcd baseline of `inbox-bench --cluster N` needs, from
# Debian's packages, only when missing: etcd-server (3.4, the members the
# harness starts on loopback), etcd-client (etcdctl, for `check perf`),
# protobuf-compiler (protoc, which the etcd-client crate's build script
# runs to generate its gRPC code) and libprotobuf-dev (the well-known
# types, google/protobuf/*.proto, that etcd's protos import). Idempotent: a second run does nothing.
# The harness starts its own members on temporary directories and free
# ports, so the system service the package would start is kept from
# starting. Then build with:
#
#   cargo build --release -p inbox-bench --features etcd
set -euo pipefail

have_etcd() {
    command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]
}

if have_etcd && command -v etcdctl >/dev/null 2>&1 && command -v protoc >/dev/null 2>&1 &&
    [ -e /usr/include/google/protobuf/descriptor.proto ]; then
    echo "etcd and protoc already installed"
    exit 0
fi

"$(dirname "$0")/apt-install.sh" etcd-server etcd-client protobuf-compiler libprotobuf-dev
echo "etcd and protoc installed"
