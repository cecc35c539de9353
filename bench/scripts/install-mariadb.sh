#!/usr/bin/env bash
# Installs the MariaDB server that inbox-bench uses as a baseline, from
# Debian's packages, only when it is missing. Idempotent: a second run does
# nothing. The harness starts its own private instance on a temporary data
# directory, so the system service is stopped and disabled if the package
# started one.
set -euo pipefail

have_server() {
    command -v mariadbd >/dev/null 2>&1 || command -v mysqld >/dev/null 2>&1 ||
        [ -x /usr/sbin/mariadbd ] || [ -x /usr/sbin/mysqld ]
}

if have_server && command -v mariadb-install-db >/dev/null 2>&1; then
    echo "mariadb-server already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# policy-rc.d keeps the package from starting a system-wide server that
# would hold port 3306 and memory for nothing.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -q --no-install-recommends mariadb-server
echo "mariadb-server installed"
