#!/usr/bin/env bash
# Run the bundled conformance suite on one backend and gate the report against a baseline.
# Usage: bash ci/gate.sh BACKEND BASELINE [extra pytest args...]
# Writes reports/{conformance.json,.md,.html, junit.xml, gate.md, gate.json}. Exit status: the
# gate's (1 on regressions, new failures, an incomplete session, a run in which no instance
# ran, or a pytest failure that no failing record explains), or pytest's own when it could not
# run the suite (4 for an unknown --backend). The gate is told
# pytest's exit status, so it is never more positive than pytest's own evidence.
# Without a baseline file, any failing instance fails (bootstrap: create one with --update).
set -uo pipefail
cd "$(dirname "$0")/.."
backend="$1"
baseline="$2"
shift 2
mkdir -p reports
rm -f reports/conformance.json reports/gate.md reports/gate.json
# --noconftest: case directories may come from untrusted pull requests (ci/pr-cases.sh); a
# conftest.py there must never run. The plugin is loaded through its entry point.
.venv/bin/python -m pytest cases/ --backend "$backend" -p no:cacheprovider --noconftest -q -rfE \
  --junitxml=reports/junit.xml -o junit_family=xunit1 "$@"
status=$?
echo "pytest exit status: $status"
if [ ! -f reports/conformance.json ]; then
  echo "::error::no conformance report was written (pytest exit status $status)"
  exit $(( status == 0 ? 1 : status ))
fi
if [ ! -f "$baseline" ]; then
  msg="no baseline at $baseline: gating on the raw outcome (any failing instance fails). Create it with: .venv/bin/collective-gate reports/conformance.json $baseline --update"
  echo "::warning::$msg"
  printf '## %s Conformance (no baseline)\n\n%s\n' "$([ "$status" -eq 0 ] && echo ✅ || echo ❌)" "$msg" > reports/gate.md
  exit "$status"
fi
.venv/bin/collective-gate reports/conformance.json "$baseline" \
  --markdown reports/gate.md --json reports/gate.json --pytest-status "$status"
gate=$?
# 2 interrupted, 3 internal error, 4 usage error: the run itself is broken, whatever the gate says.
if [ "$status" -ge 2 ] && [ "$status" -le 4 ]; then
  echo "::error::pytest did not complete the run (exit status $status)"
  exit "$status"
fi
exit "$gate"
