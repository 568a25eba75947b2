#!/usr/bin/env bash
# Run the project's tests and the bundled suite (Gloo/CPU) on one torch version, in a venv of
# its own outside the checkout, so that one suite can be checked from torch 2.4 to the newest.
#
# Usage: bash ci/torch-matrix.sh VERSION [--reports DIR] [--venv DIR] [--full] [--remove-venv]
#                                        [--skip-tests] [--skip-suite] [--index-url URL]
#   VERSION        a torch version pip can install, e.g. 2.4.1 or 2.15.0
#   --reports DIR  where the reports go (default reports/torch-VERSION/): tests.junit.xml,
#                  conformance.{json,md,html} and summary.txt
#   --venv DIR     the venv (default ${TORCH_MATRIX_VENVS:-/work/venvs}/torch-VERSION); reused
#                  when it already has that torch
#   --full         run the full library (`--full`, ~7 min on 2.13) instead of the quick suite
#   --remove-venv  delete the venv afterwards (the CUDA builds take ~5 GB)
#   --index-url    an extra package index for torch (e.g. a CPU wheel index)
# Exit status: 0 when the tests passed and the suite ran to completion with no unexpected
# failure; otherwise the first non-zero pytest status. The last lines printed are the summary.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash ci/torch-matrix.sh VERSION [--reports DIR] [--venv DIR] [--full] [--remove-venv] [--skip-tests] [--skip-suite] [--index-url URL]" >&2
  exit 4
fi
version="$1"
shift
reports="$root/reports/torch-$version"
venv="${TORCH_MATRIX_VENVS:-/work/venvs}/torch-$version"
full=""
remove=0
run_tests=1
run_suite=1
index_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reports) reports="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --full) full="--full"; shift ;;
    --remove-venv) remove=1; shift ;;
    --skip-tests) run_tests=0; shift ;;
    --skip-suite) run_suite=0; shift ;;
    --index-url) index_args=(--extra-index-url "$2"); shift 2 ;;
    *) echo "torch-matrix: unknown option '$1' (see the usage at the top of ci/torch-matrix.sh)" >&2; exit 4 ;;
  esac
done
mkdir -p "$reports"
reports=$(cd "$reports" && pwd)

cleanup() {
  if [ "$remove" -eq 1 ] && [ -d "$venv" ]; then
    rm -rf "$venv"
    echo "torch-matrix: removed $venv"
  fi
}
trap cleanup EXIT

py="$venv/bin/python"
have=""
[ -x "$py" ] && have=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)
if [ "$have" != "$version" ]; then
  echo "torch-matrix: creating $venv with torch==$version (non-CPU builds are large: minutes)"
  rm -rf "$venv"
  python3 -m venv "$venv" || exit 3
  "$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  constraints=$(mktemp)
  echo "torch==$version" > "$constraints"
  if ! "$py" -m pip install -q "${index_args[@]}" -c "$constraints" -e "$root[test]"; then
    rm -f "$constraints"
    echo "torch-matrix: could not install torch==$version with the project" >&2
    exit 3
  fi
  rm -f "$constraints"
fi
installed=$("$py" -c 'import torch; print(torch.__version__)')
echo "torch-matrix: torch $installed in $venv"

summary="$reports/summary.txt"
: > "$summary"
status=0
if [ "$run_tests" -eq 1 ]; then
  echo "torch-matrix: project tests (tests/)"
  "$py" -m pytest tests/ -q -p no:cacheprovider --junitxml="$reports/tests.junit.xml" \
    > "$reports/tests.log" 2>&1
  st=$?
  tail -n 25 "$reports/tests.log"
  echo "torch $installed tests/: $(tail -n 1 "$reports/tests.log") (exit $st)" >> "$summary"
  [ "$status" -eq 0 ] && status=$st
fi
if [ "$run_suite" -eq 1 ]; then
  echo "torch-matrix: bundled suite (cases/ --backend gloo $full)"
  "$py" -m pytest cases/ --backend gloo $full -q -p no:cacheprovider -rfE \
    --report-json "$reports/conformance.json" --report-md "$reports/conformance.md" \
    --report-html "$reports/conformance.html" > "$reports/suite.log" 2>&1
  st=$?
  tail -n 25 "$reports/suite.log"
  echo "torch $installed cases/${full:+ $full}: $(tail -n 1 "$reports/suite.log") (exit $st)" >> "$summary"
  [ "$status" -eq 0 ] && status=$st
fi
echo "== torch-matrix summary ($reports) =="
cat "$summary"
exit "$status"
