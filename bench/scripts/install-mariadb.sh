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

"$(dirname "$0")/apt-install.sh" mariadb-server
echo "mariadb-server installed"
