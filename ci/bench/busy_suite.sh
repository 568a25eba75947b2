#!/usr/bin/env bash
# The project's tests on a busy machine (issue 43): N processes spin on the CPU for the whole
# run, then ci/test.sh runs as CI runs it. Prints the load average before, during (sampled
# every 30 s) and after, and the wall time. Usage, from the checkout's root:
#
#     bash ci/bench/busy_suite.sh [N] [extra pytest arguments]     # N defaults to 6
#
# A benchmark, not a test: its figures are quoted in docs/explanation/process-model.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-6}"
shift || true
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -n "${sampler:-}" ]] && kill "$sampler" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
echo "busy_suite: load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $n spinning processes"
for _ in $(seq "$n"); do
    python3 -c 'while True: pass' &
    pids+=("$!")
done
( while sleep 30; do echo "busy_suite: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2; done ) &
sampler=$!
start=$(date +%s)
status=0
bash ci/test.sh "$@" || status=$?
end=$(date +%s)
echo "busy_suite: ci/test.sh exited $status after $((end - start)) s with $n spinning processes; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
