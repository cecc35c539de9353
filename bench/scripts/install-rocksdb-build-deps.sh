#!/usr/bin/env bash
# Installs what `cargo build -p inbox-bench --features rocksdb` needs to
# compile librocksdb-sys (libclang for bindgen, a C++ compiler), from
# Debian's packages, only when missing. Idempotent.
set -euo pipefail

have_libclang() {
    ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang-*.so* >/dev/null 2>&1
}

if have_libclang && command -v g++ >/dev/null 2>&1; then
    echo "rocksdb build dependencies already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends libclang-dev g++
echo "rocksdb build dependencies installed"
