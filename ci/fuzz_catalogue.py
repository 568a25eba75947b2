"""Proof that collective-fuzz finds real faults: every fault of collective-mutate's catalogue.

    python ci/fuzz_catalogue.py [--per-fault 300] [--faults a,b] [--seed 0] [--json PATH]

For each fault class of harness/mutate/faults.py, runs ``collective-fuzz --backend mutant``
(the fault-injecting Gloo wrapper, the fault named in COLLECTIVE_MUTANT) with no bundled case
(``--no-bundled``) and no hint, for at most ``--per-fault`` seconds, stopping at the first
finding, and prints a Markdown table: fault | found? | time to first finding | minimal case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.mutate.faults import BACKEND, BACKEND_MODULE, ENV, FAITHFUL, NAMES  # noqa: E402

ORIGINAL = 22  # the catalogue's first 22 classes (the numerics four came later)


def one(fault: str, per_fault: float, seed: int, work: Path, skip: str = "",
        stop: bool = True) -> dict[str, object]:
    out = work / fault
    cmd = [sys.executable, "-m", "harness.fuzz", "--backend", BACKEND, "--backend-module",
           BACKEND_MODULE, "--no-bundled", "--time", f"{per_fault}s", "--seed", str(seed),
           "--out", str(out), "-q", "--skip-signatures", skip]
    cmd += ["--stop-at-first"] if stop else []
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env={**os.environ, ENV: fault}, capture_output=True, text=True,
                          timeout=per_fault + 240, check=False, cwd=ROOT)
    took = time.monotonic() - t0
    files = sorted(out.glob("*.yaml"))
    first = ""
    sigs = []
    for line in proc.stdout.splitlines():
        if line.strip().startswith("FINDING") and "after" in line:
            sigs.append(line.split()[1].rstrip(":"))
            first = first or line.split("(after", 1)[1].split(",")[1].strip(" )")
    minimal = ""
    if files:
        import yaml

        case = yaml.safe_load(files[0].read_text())["cases"][0]
        keep = ("op", "world_size", "dtype", "shape", "reduce_op", "args", "layout",
                "offset", "async")
        minimal = ", ".join(f"{k}={case[k]}" for k in keep if k in case) or (
            f"program, {len(case.get('steps', []))} steps")
    return {"fault": fault, "found": bool(files), "signatures": " ".join(sigs),
            "time_to_first": first,
            "wall_s": round(took, 1), "minimal": minimal,
            "case_file": files[0].name if files else "", "rc": proc.returncode,
            "tail": "" if files else (proc.stdout + proc.stderr)[-400:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-fault", type=float, default=300.0)
    ap.add_argument("--faults", default=",".join(NAMES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faithful-time", type=float, default=120.0,
                    help="seconds of fuzzing the faithful wrapper (its findings are skipped)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fuzz-catalogue-") as tmp:
        # The faithful wrapper first: what the fuzzer finds there is Gloo's own behaviour
        # (found by the fuzzer itself, not written by hand), never a fault's finding.
        base = one(FAITHFUL, args.faithful_time, args.seed, Path(tmp), stop=False)
        skip = ",".join(sorted(str(base["signatures"]).split())) if base["signatures"] else ""
        print(f"faithful wrapper: {skip or 'no finding'}", file=sys.stderr, flush=True)
        for fault in [f for f in args.faults.split(",") if f]:
            row = one(fault, args.per_fault, args.seed, Path(tmp), skip)
            rows.append(row)
            print(f"{fault}: {'found' if row['found'] else 'not found'} "
                  f"{row['time_to_first']} {row['minimal']}", file=sys.stderr, flush=True)
    print("| fault | found? | time to first finding | minimal case |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {'yes' if r['found'] else 'no'} | {r['time_to_first'] or '-'} "
              f"| {str(r['minimal']).replace('|', '/')} |")
    orig = [r for r in rows if r["fault"] in NAMES[:ORIGINAL]]
    print(f"\nfound {sum(bool(r['found']) for r in rows)}/{len(rows)} "
          f"({sum(bool(r['found']) for r in orig)}/{len(orig)} of the original {ORIGINAL}); "
          f"at most {args.per_fault:.0f} s each")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
