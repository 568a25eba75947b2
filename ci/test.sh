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
# 2-core machine instead of about 19, but in two runs of four the Ctrl-C tests' child sessions
# sat through the SIGINT they were sent, and so did one serial run with test_record.py and
# test_external.py moved first (the cause is not found; those tests' messages now print the
# child's signal masks): CI stays serial, files in their usual order, until it is.
.venv/bin/python -m pytest tests/ -q "$@"
