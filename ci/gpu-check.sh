#!/usr/bin/env bash
# Verify the harness on a GPU machine in one run: install from the checkout and the wheels of
# ci/gpu-wheels.sh without network (the machine's own torch is left alone), then run each part
# under its own time limit, keep going when one fails or hangs, and write reports, env.json,
# probes.json, summary.md and summary.json into one folder. Parts (docs/howto/gpu.md says more):
#   nccl-ws1            the whole bundled library (--full) on NCCL at world size 1
#   gloo-cuda           Gloo with CUDA tensors at world sizes 2-4 (the `device: cuda` instances)
#   ordering-nccl       the ordering/p2p/cuda/all_reduce files on NCCL with every probe (--ordering all)
#   ordering-gloo-cuda  the Gloo CUDA instances with every probe
#   probes              host blocking of NCCL calls behind a sleep kernel (ci/gpu/gpu_probes.py)
#   record-nccl         collective-record on the DDP example on CUDA/NCCL (ci/gpu/record_ddp.py)
#   replay-nccl         the case file it wrote, run on NCCL
#   perf-nccl           perf mode, 1 MiB .. 256 MiB, NCCL at world size 1 (ci/gpu/perf-large.yaml)
#   perf-gloo-cuda      perf mode, 1 MiB .. 256 MiB, Gloo with CUDA tensors at world size 2
#   backend-NAME        the library on each other NCCL-family backend torch registers
# The CUDA cases, sparse CUDA and upstream NCCL cases that had never run are counted from the
# first two parts' reports (summary "never run").
#
# Usage: bash ci/gpu-check.sh [--dry-run] [--out DIR] [--wheels DIR] [--python PY] [--budget S]
#   --dry-run     (or CUDA_VISIBLE_DEVICES= set empty) on a CPU machine: install the wheels
#                 into a temporary target for CPython 3.12 x86-64 with the network off, run every
#                 part (the CUDA ones skip with their reason) and check the folder has what a
#                 GPU run writes
#   --out DIR     an empty or new folder (default reports/gpu-check-DATE)
#   --wheels DIR  the wheels of ci/gpu-wheels.sh (default .whl)
#   --python PY   the interpreter (default: python3 on a GPU machine, .venv/bin/python dry)
#   --budget S    seconds for all parts together (default 540: a device call allows 600); in a
#                 dry run the parts have no limits of their own, only this one
# Exit status: 0 when every part is ok (dry run: when the run wrote everything), 1 when a part
# failed, timed out or wrote no report, 2 for bad usage or a failed install.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

usage() { sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
dry=0
[ "${CUDA_VISIBLE_DEVICES-unset}" = "" ] && dry=1
out=""
wheels=".whl"
py=""
budget=540
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
    --wheels) [ $# -ge 2 ] || usage; wheels="$2"; shift 2 ;;
    --python) [ $# -ge 2 ] || usage; py="$2"; shift 2 ;;
    --budget) [ $# -ge 2 ] || usage; budget="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "gpu-check: unknown option '$1'" >&2; usage ;;
  esac
done
case "$budget" in ''|*[!0-9]*) echo "gpu-check: --budget takes whole seconds, not '$budget'" >&2; exit 2 ;; esac
[ "$budget" -ge 30 ] || { echo "gpu-check: --budget must be at least 30 s" >&2; exit 2; }
if [ -z "$py" ]; then
  if [ "$dry" -eq 1 ] && [ -x .venv/bin/python ]; then py="$root/.venv/bin/python"; else py=python3; fi
fi
[ -n "$out" ] || out="reports/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "gpu-check: $out is not empty; give an empty or new folder with --out" >&2; exit 2
fi
mkdir -p "$out" || { echo "gpu-check: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
  echo "gpu-check: no wheels in $wheels; run 'bash ci/gpu-wheels.sh' on a machine with network first" >&2
  exit 2
fi
wheels=$(cd "$wheels" && pwd)
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
: > "$out/parts.tsv"

# ---- install, with the network off ---------------------------------------------------------
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
export http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9
export HTTP_PROXY=$http_proxy HTTPS_PROXY=$https_proxy
start=$(date +%s)
{
  set -e
  if [ "$dry" -eq 1 ]; then
    # The device's interpreter is CPython 3.12: prove the wheels install there, as a set.
    plats=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
      plats+=(--platform "$p")
    done
    "$py" -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: \
      --python-version 3.12 --implementation cp "${plats[@]}" --target "$site/device" "$wheels"/*.whl
  else
    "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site/lib" "$wheels"/*.whl
  fi
  "$py" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --target "$site/lib" "$root"
  set +e
} > "$out/install.log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
  export PYTHONPATH="$site/lib${PYTHONPATH:+:$PYTHONPATH}"
  "$py" ci/gpu/gpu_wheels.py check --dest "$wheels" >> "$out/install.log" 2>&1 || rc=1
  # Every module the harness imports, and the plugin through its pytest11 entry point.
  "$py" -c "import importlib.metadata as m, yaml, jsonschema, fastjsonschema, re2, packaging, numpy, pytest, xdist, torch
eps = [e for e in m.entry_points(group='pytest11') if e.name == 'collective_harness']
assert eps, 'no pytest11 entry point named collective_harness'
eps[0].load()" >> "$out/install.log" 2>&1 || rc=1
fi
printf 'install\t%s\t%s\t-\t%s\n' "$rc" "$(( $(date +%s) - start ))" 0 >> "$out/parts.tsv"
if [ "$rc" -ne 0 ]; then
  echo "gpu-check: install failed (exit $rc); see $out/install.log" >&2
  tail -5 "$out/install.log" >&2
  "$py" ci/gpu/gpu_summary.py "$out" || true
  exit 2
fi

# ---- the machine ---------------------------------------------------------------------------
DRY=$dry "$py" - "$out/env.json" <<'EOF' > "$out/env.log" 2>&1
import json, os, platform, subprocess, sys
import torch, torch.distributed as dist
env = {"dry_run": os.environ["DRY"] == "1", "python": platform.python_version(),
       "torch": torch.__version__, "cuda": torch.version.cuda or "none", "host": platform.node(),
       "cpus": os.cpu_count(), "gpus": torch.cuda.device_count()}
env["device"] = torch.cuda.get_device_name(0) if env["gpus"] else "no GPU"
try:
    env["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if env["gpus"] else "none"
except Exception as exc:
    env["nccl"] = f"unknown ({exc})"
try:
    env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=30).stdout.strip() or "none"
except (OSError, subprocess.SubprocessError):
    env["driver"] = "none"
env["backends"] = list(dist.Backend.backend_list)
# NCCL-family backends besides nccl: torch's own (e.g. an in-tree nccl2) and any a
# torchcomms install registers. Those the harness runs as its own parts.
try:
    import torchcomms  # noqa: F401
    env["backends"] = list(dist.Backend.backend_list)
    env["torchcomms"] = getattr(torchcomms, "__version__", "present")
except ImportError:
    env["torchcomms"] = "absent"
env["other_nccl_backends"] = [b for b in env["backends"] if "nccl" in b.lower() and b != "nccl"]
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env))
EOF

# ---- the parts -----------------------------------------------------------------------------
deadline=$(( $(date +%s) + budget ))
run_part() {  # NAME BUDGET REPORT-OR-DASH COMMAND...
  local name=$1 want=$2 report=$3; shift 3
  local left=$(( deadline - $(date +%s) ))
  local limit=$(( want < left ? want : left ))
  # A dry run proves that each part runs and writes its files, not how fast a CPU machine runs
  # it (a busy CI runner spends minutes where a GPU spends seconds): only the budget bounds it.
  [ "$dry" -eq 1 ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    printf '%s\t%s\t%s\t-\t%s\n' "$name" 124 0 "$want" >> "$out/parts.tsv"
    echo "gpu-check: $name: not run, the run's budget is spent"
    return
  fi
  local t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout -k 15 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$report" "$limit" >> "$out/parts.tsv"
  echo "gpu-check: $name: exit $rc after $(( $(date +%s) - t0 )) s"
}
pytest_part() {  # NAME BUDGET PYTEST-ARGS...
  local name=$1 want=$2; shift 2
  run_part "$name" "$want" "$name.json" "$py" -m pytest -q -p no:cacheprovider \
    --report-json "$out/$name.json" --report-md "$out/$name.md" --report-html "$out/$name.html" "$@"
}
big=(--max-buffer-bytes 268435456 --max-instance-bytes 4294967296)
pytest_part nccl-ws1 200 cases/ --backend nccl --world-size 1 --full
pytest_part gloo-cuda 90 cases/ --backend gloo --world-size 2,3,4 --full -k cuda
pytest_part ordering-nccl 60 cases/ordering.yaml cases/p2p.yaml cases/cuda.yaml cases/all_reduce.yaml \
  --backend nccl --world-size 1 --ordering all
pytest_part ordering-gloo-cuda 60 cases/ --backend gloo --world-size 2,3,4 --full -k cuda --ordering all
run_part probes 60 - "$py" ci/gpu/gpu_probes.py "$out/probes.json"
run_part record-nccl 120 - "$py" ci/gpu/record_ddp.py "$out"
pytest_part replay-nccl 60 "$out/record-nccl.yaml" --backend nccl
pytest_part perf-nccl 150 ci/gpu/perf-large.yaml --perf --backend nccl "${big[@]}"
pytest_part perf-gloo-cuda 90 ci/gpu/perf-large.yaml --perf --backend gloo "${big[@]}" \
  --perf-warmup 2 --perf-iters 5 --perf-repeats 3
for b in $("$py" -c "import json,sys; print(' '.join(json.load(open(sys.argv[1])).get('other_nccl_backends', [])))" "$out/env.json" 2>/dev/null); do
  pytest_part "backend-$b" 120 cases/ --backend "$b" --world-size 1 --full
done

# ---- the summary ---------------------------------------------------------------------------
if [ "$dry" -eq 1 ]; then
  "$py" ci/gpu/gpu_summary.py "$out" --expect
  exit $?
fi
"$py" ci/gpu/gpu_summary.py "$out" || exit 1
"$py" - "$out/summary.json" <<'EOF'
import json, sys
bad = [p["part"] for p in json.load(open(sys.argv[1]))["parts"]
       if p["status"] not in ("ok", "all skipped")]
print(f"gpu-check: {'every part ok' if not bad else 'not ok: ' + ', '.join(bad)}")
sys.exit(1 if bad else 0)
EOF
