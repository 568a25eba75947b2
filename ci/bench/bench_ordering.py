"""Benchmark: what the automatic ordering probes add per instance and to the bundled suite.

    .venv/bin/python ci/bench/bench_ordering.py [--repeat 8] [--delay 0.02]

Runs a generated file of async shorthand cases (several ops, world sizes 2 and 4, each
repeated through a ``params`` axis) once with ``--ordering none`` and once with ``--ordering
all``, and compares the median instance duration from the JSON reports (the first instance of
each pool, which pays for starting it, is left out). Then it runs the bundled ``cases/`` with
``--ordering none`` and with the default (a sample) and prints both wall times. Timings, not
assertions: the machine's load moves them; compare runs made side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OPS = {
    "all_reduce": "",
    "all_gather": "",
    "broadcast": "    args: {src: 0}\n",
    "reduce": "    args: {dst: 0}\n",
    "reduce_scatter": "",
}


def _case_file(repeat: int) -> str:
    lines = ["cases:"]
    for op, args in OPS.items():
        shape = "[world_size, 8]" if op == "reduce_scatter" else "[8]"
        lines.append(f"  - name: {op}\n    op: {op}\n    world_size: [2, 4]\n    async: true\n"
                     f"    shape: {shape}\n    input: \"rank * 8 + i\"\n{args}"
                     f"    params: {{k: {list(range(repeat))}}}")
    return "\n".join(lines) + "\n"


def _pytest(args: list[str], cwd: Path, report: Path) -> tuple[float, list[dict[str, Any]]]:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--report-json", str(report), "--report-md", str(report.with_suffix(".md")),
                    *args], cwd=cwd, check=False, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    return wall, json.loads(report.read_text())["records"]


def _per_instance(records: list[dict[str, Any]]) -> dict[int, float]:
    by_ws: dict[int, list[float]] = {}
    for rec in sorted(records, key=lambda r: str(r["key"])):
        if rec["outcome"] == "passed":
            by_ws.setdefault(int(rec["world_size"]), []).append(float(rec["duration_s"]))
    return {ws: statistics.median(d[1:] or d) for ws, d in sorted(by_ws.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.02)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "bench_ordering.yaml").write_text(_case_file(opts.repeat))
        result: dict[str, dict[int, float]] = {}
        for mode in ("none", "all"):
            _, records = _pytest(["bench_ordering.yaml", "--ordering", mode, "--ordering-delay",
                                  str(opts.delay)], folder, folder / f"{mode}.json")
            result[mode] = _per_instance(records)
        print(f"median instance duration (s), {len(OPS)} ops x {opts.repeat} repeats, "
              f"delay {opts.delay:g} s:")
        for ws in result["none"]:
            off, on = result["none"][ws], result["all"].get(ws, float("nan"))
            print(f"  ws{ws}: without probes {off:.4f}  with probes {on:.4f}  "
                  f"added {on - off:.4f}")
        walls: dict[str, float] = {}
        counts: dict[str, int] = {}
        for mode in ("none", "auto"):
            wall, records = _pytest([str(REPO / "cases"), "--ordering", mode, "--ordering-delay",
                                     str(opts.delay)], REPO, folder / f"suite-{mode}.json")
            walls[mode] = wall
            counts[mode] = sum(1 for r in records if r.get("ordering", {}).get("probes"))
        print(f"bundled cases/: wall {walls['none']:.1f} s without probes, {walls['auto']:.1f} s "
              f"with the default sample ({counts['auto']} probed instances)")


if __name__ == "__main__":
    main()
