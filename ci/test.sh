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
# Four xdist workers, whole files each (--dist loadfile: a file's module fixtures, e.g. a
# recording several tests read, run once). On the 2-core machine: about 19 minutes serial idle,
# 11 to 12.5 with four workers; a fresh clone passed with them in 34 minutes while other jobs
# kept the load average at 10-30, and `.ci/run` took 13.5 minutes in all at load 3-5
# (2026-11-27). The longest file sets the floor of the wall time (tests/test_record.py did,
# at 7 minutes alone: now four files by topic): split such a file before adding workers.
.venv/bin/python -m pytest tests/ -q -n 4 --dist loadfile "$@"
