#!/usr/bin/env bash
# The main job: install, then run the bundled conformance suite on Gloo/CPU.
# Writes reports/conformance.json and reports/conformance.md. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/python -m pytest cases/ --backend gloo -q "$@"
