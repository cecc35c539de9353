#!/usr/bin/env bash
# Installs what `--features rocksdb` needs, from Debian's packages, only
# when missing: Debian's RocksDB library (librocksdb-dev, linked instead of
# compiling the bundled C++ sources, which takes about an hour on two cores)
# and libclang for the bindings. Idempotent. Then build with:
#
#   ROCKSDB_LIB_DIR=/usr/lib/x86_64-linux-gnu \
#       cargo build --release -p inbox-bench --features rocksdb
set -euo pipefail

have_libclang() {
    ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 ||
        ls /usr/lib/x86_64-linux-gnu/libclang-*.so* >/dev/null 2>&1
}
have_rocksdb() {
    [ -e /usr/include/rocksdb/c.h ] && ls /usr/lib/*/librocksdb.so >/dev/null 2>&1
}

if have_libclang && have_rocksdb && command -v g++ >/dev/null 2>&1; then
    echo "rocksdb build dependencies already installed"
    exit 0
fi

"$(dirname "$0")/apt-install.sh" libclang-dev g++ librocksdb-dev
echo "rocksdb build dependencies installed"
