#!/usr/bin/env bash
# System packages some tests need (see docs/install.md): Chromium renders the HTML
# report in a browser test. Installs only what is missing; needs root (or sudo).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null
