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
# Four workers on any machine, two cores or more: most of the suite's wall time is waiting
# (child pytest sessions and ranks starting, declared hangs and timeouts running to their
# deadline), not CPU; measured serial on the 2-core machine, 12.6 CPU minutes in 20 wall
# minutes. Whole files per worker (loadfile): module fixtures (real runs shared by several
# tests) then run once. No test may depend on the machine being idle: this runs each at a
# load of four or more on two cores.
.venv/bin/python -m pytest tests/ -q -n 4 --dist loadfile "$@"
