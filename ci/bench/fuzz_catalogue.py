"""Proof that collective-fuzz finds real faults: every fault of collective-mutate's catalogue.

    python ci/bench/fuzz_catalogue.py [--per-fault 300] [--faults a,b] [--seed 0] [--json PATH]

For each fault class of harness/mutate/faults.py, runs ``collective-fuzz --backend mutant``
(the fault-injecting Gloo wrapper, the fault named in COLLECTIVE_MUTANT) with no bundled case
(``--no-bundled``) and no hint, for at most ``--per-fault`` seconds, stopping at the first
finding, and prints a Markdown table: fault | found? | time to first finding | minimal case.

Attribution: the fuzzer runs with ``--confirm-against mutant --confirm-env
COLLECTIVE_MUTANT=none``, so a bad instance is a finding only if it passes on the faithful
wrapper (Gloo behind the same Python ProcessGroup); one that is bad there too is reported
apart ("also fails without the fault", column 5) and the fuzzing goes on. Then the written
minimal case file is run under ``pytest`` both ways: it must fail under the fault and pass
on the faithful wrapper; a finding pytest does not confirm (a race the in-process run lost
and pytest won) is set aside, its signature skipped, and the fuzzing goes on in the time
left. "time to first finding" is that of the first confirmed one, from the fault's start.
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
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.fuzz import space  # noqa: E402
from harness.mutate.faults import BACKEND, BACKEND_MODULE, ENV, FAITHFUL, NAMES  # noqa: E402

ORIGINAL = 22  # the catalogue's first 22 classes (the numerics four came later)


def describe_case(case: dict[str, Any]) -> str:
    """A one-line description of a generated case (shorthand keys, or a program's steps)."""
    keep = ("op", "world_size", "dtype", "shape", "reduce_op", "args", "layout", "offset",
            "async")
    if "op" in case:
        text = ", ".join(f"{k}={case[k]}" for k in keep if k in case)
        gen = (case.get("input") or {}).get("generator")
        return text + (f", input {gen}" if gen else "")
    steps = case.get("steps", [])
    calls = [str(s.get("op")) + (" async" if s.get("async") else "") for s in steps
             if "op" in s]
    extra = ["sleep"] * any("sleep" in s for s in steps) + [
        f"{sum('wait' in s for s in steps)} wait(s)"]
    return (f"{space.program_op(case)} program, world_size={case.get('world_size')}, "
            f"dtype={case.get('dtype', '-')}: " + ", ".join(calls + extra))


def pytest_verdict(case_file: Path, fault: str, cwd: Path) -> str:
    """``passed``/``failed``/... of ``case_file`` under pytest on the mutant with ``fault``."""
    cmd = [sys.executable, "-m", "pytest", str(case_file), "-q", "-p", "no:cacheprovider",
           "--no-report", "-o", "collective_baseline=", "--backend-module", BACKEND_MODULE,
           "--backend", BACKEND]
    proc = subprocess.run(cmd, env={**os.environ, ENV: fault}, capture_output=True, text=True,
                          timeout=300, check=False, cwd=cwd)
    tail = proc.stdout.strip().splitlines()[-1:] or ["?"]
    for word in ("failed", "passed", "error", "xfailed", "skipped"):
        if f" {word}" in f" {tail[0]}":
            return word
    return tail[0][:80]


def attempt(fault: str, budget: float, seed: int, out: Path, skip: str
            ) -> tuple[subprocess.CompletedProcess[str], list[str], float | None, list[str]]:
    """One fuzzer run: (process, finding signatures, in-run seconds to the first, also-fails)."""
    cmd = [sys.executable, "-m", "harness.fuzz", "--backend", BACKEND, "--backend-module",
           BACKEND_MODULE, "--no-bundled", "--time", f"{budget:.1f}s", "--seed", str(seed),
           "--out", str(out), "-q", "--skip-signatures", skip, "--stop-at-first",
           "--confirm-against", BACKEND, "--confirm-env", f"{ENV}={FAITHFUL}"]
    proc = subprocess.run(cmd, env={**os.environ, ENV: fault}, capture_output=True, text=True,
                          timeout=budget + 240, check=False, cwd=ROOT)
    sigs: list[str] = []
    first: float | None = None
    for line in proc.stdout.splitlines():
        if line.strip().startswith("FINDING") and "after" in line:
            sigs.append(line.split()[1].rstrip(":"))
            if first is None:
                first = float(line.split("(after", 1)[1].split(",")[1].strip(" )s"))
    also = [line.split()[5].rstrip(":") for line in proc.stdout.splitlines()
            if line.strip().startswith("ALSO FAILS WITHOUT THE FAULT")]
    return proc, sigs, first, also


def one(fault: str, per_fault: float, seed: int, work: Path, check: bool = True
        ) -> dict[str, object]:
    """Fuzz ``fault`` for at most ``per_fault`` seconds until a confirmed finding. A finding
    whose case file pytest does not confirm (e.g. a race the in-process run lost and pytest
    won) is set aside: its signature is skipped and the fuzzing goes on in the time left."""
    t0 = time.monotonic()
    unconfirmed: list[str] = []
    also: set[str] = set()
    notes: list[str] = []
    k = 0
    row: dict[str, object] = {}
    while (left := per_fault - (time.monotonic() - t0)) > 5:
        out = work / fault / f"attempt{k}"
        offset = time.monotonic() - t0
        proc, sigs, first, more = attempt(fault, left, seed + k, out, ",".join(unconfirmed))
        also |= set(more)
        files = sorted(out.glob("*.yaml"))
        row = {"rc": proc.returncode, "tail": (proc.stdout + proc.stderr)[-400:]}
        if not files:
            break
        if check:
            under, without = (pytest_verdict(files[0], fault, work),
                              pytest_verdict(files[0], FAITHFUL, work))
            notes.append(f"{sigs[0] if sigs else files[0].stem}: pytest {under} under the "
                         f"fault, {without} without")
            if under != "failed" or without != "passed":
                unconfirmed += sigs[:1]
                k += 1
                continue
        case = yaml.safe_load(files[0].read_text())["cases"][0]
        return {"fault": fault, "found": True, "signatures": " ".join(sigs),
                "also_fails": " ".join(sorted(also)), "confirmed": "; ".join(notes),
                "unconfirmed": " ".join(unconfirmed),
                "time_to_first": f"{offset + (first or 0.0):.1f} s",
                "wall_s": round(time.monotonic() - t0, 1), "minimal": describe_case(case),
                "case_file": files[0].name, "case": files[0].read_text(), "rc": row["rc"],
                "tail": ""}
    return {"fault": fault, "found": False, "signatures": "", "also_fails":
            " ".join(sorted(also)), "confirmed": "; ".join(notes),
            "unconfirmed": " ".join(unconfirmed), "time_to_first": "",
            "wall_s": round(time.monotonic() - t0, 1), "minimal": "", "case_file": "",
            "rc": row.get("rc", ""), "tail": row.get("tail", "")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-fault", type=float, default=300.0)
    ap.add_argument("--faults", default=",".join(NAMES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-pytest-check", action="store_true",
                    help="do not run the written case files under pytest both ways")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fuzz-catalogue-") as tmp:
        for fault in [f for f in args.faults.split(",") if f]:
            row = one(fault, args.per_fault, args.seed, Path(tmp),
                      check=not args.no_pytest_check)
            rows.append(row)
            print(f"{fault}: {'found' if row['found'] else 'not found'} "
                  f"{row['time_to_first']} {row['minimal']} [{row['confirmed']}] "
                  f"also-fails: {row['also_fails'] or '-'} ({row['wall_s']} s)",
                  file=sys.stderr, flush=True)
            if args.json:  # as it goes: a long run leaves its rows behind
                Path(args.json).write_text(json.dumps(rows, indent=1))
    print("| fault | found? | time to first finding | minimal case | also fails without the "
          "fault |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['fault']} | {'yes' if r['found'] else 'no'} | {r['time_to_first'] or '-'} "
              f"| {str(r['minimal']).replace('|', '/')} | {r['also_fails'] or '-'} |")
    orig = [r for r in rows if r["fault"] in NAMES[:ORIGINAL]]
    print(f"\nfound {sum(bool(r['found']) for r in rows)}/{len(rows)} "
          f"({sum(bool(r['found']) for r in orig)}/{len(orig)} of the original {ORIGINAL}); "
          f"at most {args.per_fault:.0f} s each")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
