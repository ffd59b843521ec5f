#!/usr/bin/env bash
# Debian's headless-capable Chromium, for the test that renders the HTML report.
# Installs with apt-get when missing (root, or sudo without a password); the report test
# skips, saying why, when Chromium cannot be installed.
set -euo pipefail
for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "chromium missing and no root to install it: apt-get install chromium" >&2
    exit 1
fi
$SUDO apt-get install -y -qq chromium >/dev/null 2>&1 || {
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null; }
