#!/usr/bin/env bash
# Download, on a CPU machine with network, the wheels a GPU device machine needs to run the
# harness (Python 3.12, x86-64; torch, NCCL and most dependencies are already in its image),
# into the folder .whl/ (git-ignored; one version of each), then check the set is complete
# and fits with the checkout in the 64 MiB a device call carries. See docs of ci/gpu-check.sh.
# Usage: bash ci/gpu-wheels.sh [--dest DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash ci/setup.sh
exec .venv/bin/python ci/gpu/gpu_wheels.py download "$@"
