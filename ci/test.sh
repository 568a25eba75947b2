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
# One process. Tried with four xdist workers (whole files each): 11 to 12.5 minutes idle on the
# 2-core machine instead of about 19; the Ctrl-C tests that failed in some of those runs failed
# because the runs were background jobs (SIGINT ignored, see tests/conftest.py), not because of
# the workers. Four workers are the next step once a run of them is checked end to end.
.venv/bin/python -m pytest tests/ -q "$@"
