#!/usr/bin/env bash
# System packages the test suites need beyond PyPI: Debian's headless Chromium (driven by
# Playwright with executable_path=/usr/bin/chromium; Playwright's own browser download is
# never used). Idempotent: does nothing when chromium is already installed.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ] && ! command -v sudo >/dev/null 2>&1; then
    echo "setup: chromium is missing; install Debian's 'chromium' package (needed by the web report tests)" >&2
    exit 1
fi
bash "$(dirname "$0")/apt_install.sh" chromium >/dev/null
echo "setup: installed $(chromium --version)"
