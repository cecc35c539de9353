#!/usr/bin/env bash
# Installs redis-server, a baseline of inbox-bench, from Debian's packages,
# only when it is missing. Idempotent: a second run does nothing. The harness
# starts its own redis-server on a temporary directory and a free port.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; then
    echo "redis-server already installed"
    exit 0
fi

"$(dirname "$0")/apt-install.sh" redis-server
echo "redis-server installed"
