#!/usr/bin/env bash
# Debian's chromium and chromedriver for the web app's browser tests (tests/integration/test_app.py).
# Installs them with apt when they are missing and this runs as root (or with passwordless sudo);
# otherwise says how in one line and leaves the tests to skip. --required (CI): fail instead.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
as_root=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then as_root="sudo"; else as_root="none"; fi
fi
if [ "$as_root" != "none" ] && command -v apt-get >/dev/null 2>&1; then
  if $as_root apt-get update -qq && $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; then
    exit 0
  fi
fi
echo "chromium and chromedriver are not installed, so the web app's browser tests will be skipped; install them with: sudo apt-get install chromium chromium-driver" >&2
if [ "${1:-}" = "--required" ]; then exit 1; fi
exit 0
