#!/usr/bin/env bash
# Installs Debian packages for the bench's install scripts: as root or
# through sudo, non-interactively, without recommended packages, and with
# the packages' services kept from starting while the install runs (a
# policy-rc.d that refuses every start): the harness starts its own
# private instances on temporary directories and free ports, and a
# system-wide one would hold ports and memory for nothing.
#
#   bench/scripts/apt-install.sh PACKAGE...
set -euo pipefail

SUDO=
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -q --no-install-recommends "$@"
