#!/usr/bin/env bash
# Create .venv and install the harness (editable) with the given extras, torch pinned by
# ci/constraints.txt. Usage: bash ci/setup.sh [EXTRAS]   e.g. bash ci/setup.sh test,dev
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
.venv/bin/python -m pip install -q -c ci/constraints.txt -e "$spec"
# Bytecode for the harness, as a wheel install has it: an editable install has none, and where
# PYTHONDONTWRITEBYTECODE is set (this project's CI machines set it) every session, its
# forkserver and its ranks would compile the harness from source again: 0.2-0.3 s a session,
# measured on a 300-instance session (docs/explanation/process-model.md, "Session cost").
.venv/bin/python -m compileall -q harness
