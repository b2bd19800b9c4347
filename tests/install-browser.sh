#!/usr/bin/env bash
# The dashboard test drives a real headless browser: Debian's chromium and its driver.
# Installs them when missing (needs root or sudo, and apt); a no-op when they are there.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then exit 0; fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
$sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null \
  || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; }
