#!/usr/bin/env bash
# Installs Debian's chromium when it is absent: the console's browser tests
# (tests/test_console_browser.py) drive it through playwright's executable_path, since
# `playwright install` downloads a browser build, which this project never relies on.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-chromium: chromium is absent and installing it needs root (apt-get)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
