#!/usr/bin/env bash
# Install a Debian package for the tests when none of its commands is on PATH:
#   bash scripts/apt_get.sh PACKAGE COMMAND [COMMAND ...]
# Uses apt-get as root, or sudo without a password; the tests that need the package
# skip, saying why, when it cannot be installed.
set -euo pipefail
package=$1
shift
for name in "$@"; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "$package missing and no root to install it: apt-get install $package" >&2
    exit 1
fi
$SUDO apt-get install -y -qq "$package" >/dev/null 2>&1 || {
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$package" >/dev/null; }
