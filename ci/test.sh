#!/usr/bin/env bash
# The project's own checks: lint, types, then the test suite (unit, pytester, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh test,dev,docs
.venv/bin/ruff check .
.venv/bin/mypy
# The docs site: a broken link or anchor, or a page missing from the nav, fails the build. Not -q:
# mkdocs counts strict-mode warnings only at the log level it prints, so -q would let them pass.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d build/site 2>&1 | { grep -v '^INFO' || true; }
.venv/bin/python -m pytest tests/ -q "$@"
