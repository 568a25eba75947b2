#!/usr/bin/env bash
# System packages some tests need (see docs/howto/install.md): Chromium renders the HTML
# report in a browser test; a C++ compiler builds collective-record's C++ kernel
# (harness/record/native), which the recorder tests compare with the Python one.
# Installs only what is missing; needs root (or sudo).
set -euo pipefail
want=()
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  want+=(chromium)
fi
command -v c++ >/dev/null 2>&1 || want+=(g++)
[ "${#want[@]}" -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${want[@]}" >/dev/null
