#!/usr/bin/env bash
# Debian's redis-server, for the tests of the shared response cache (--cache redis://).
# The tests start their own on a free 127.0.0.1 port. Installs with apt-get when missing
# (root, or sudo without a password); the Redis tests skip, saying why, without it.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "redis-server missing and no root to install it: apt-get install redis-server" >&2
    exit 1
fi
$SUDO apt-get install -y -qq redis-server >/dev/null 2>&1 || {
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null; }
# the package may start a system-wide server on 6379; the tests do not use it
