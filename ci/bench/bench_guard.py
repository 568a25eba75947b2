"""The cost of collective-guard (issue 41 point 4), measured.

    python ci/bench/bench_guard.py [--pairs 6] [--steps 60] [--json PATH]

The DDP step of ``examples/ddp_buckets.py``'s model at ``bucket_cap_mb=1`` (the recorder's
benchmark worker, ``bench_record_workers.STEP``: Gloo, 2 ranks, one thread each), run plain
and under the guard at the default sampling (1 in 100) and at every call, in alternating
order per pair so that drift in the machine's load hits every side. Two figures per run:
rank 0's median step time and the CPU time per step of both rank processes. Reported: per
setting, the median and range of the per-pair ratios to the plain run, with the load average
before and after. Budgets: +1 % at the default, +15 % at every call. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_record_workers import STEP  # noqa: E402

from harness.guard.cli import SITE  # noqa: E402
from harness.guard.settings import DIR_ENV, ENV, Settings, to_env  # noqa: E402

BUDGET = {"100": 1.01, "every": 1.15}


def _run(script: Path, tmp: Path, steps: int, every: int | None) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if every is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT)])
        env[DIR_ENV] = str(tmp)
        env[ENV] = to_env(Settings(every=every))
    out = tmp / "r"
    subprocess.run([sys.executable, str(script), "10", str(steps), "0", str(out)], env=env,
                   check=True, timeout=600)
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    return ranks[0]["median_s"], sum(r["cpu_s"] for r in ranks)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    load0 = os.getloadavg()
    ratios: dict[str, list[tuple[float, float]]] = {"100": [], "every": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        script = tmp / "step.py"
        script.write_text(STEP)
        for i in range(a.pairs):
            sides: list[tuple[str, int | None]] = [("plain", None), ("100", 100),
                                                   ("every", 1)]
            if i % 2:
                sides.reverse()
            got = {name: _run(script, tmp, a.steps, every) for name, every in sides}
            for name in ratios:
                ratios[name].append((got[name][0] / got["plain"][0],
                                     got[name][1] / got["plain"][1]))
    load1 = os.getloadavg()
    result: dict[str, Any] = {"load_before": load0, "load_after": load1, "pairs": a.pairs,
                              "steps": a.steps}
    ok = True
    for name, rs in ratios.items():
        wall, cpu = [r[0] for r in rs], [r[1] for r in rs]
        result[name] = {"wall_median": statistics.median(wall), "wall_range": [min(wall),
                        max(wall)], "cpu_median": statistics.median(cpu),
                        "cpu_range": [min(cpu), max(cpu)]}
        ok &= statistics.median(wall) <= BUDGET[name]
        print(f"sample {name}: step time x{statistics.median(wall):.3f} (range "
              f"{min(wall):.3f}-{max(wall):.3f}), CPU per step x{statistics.median(cpu):.3f} "
              f"(range {min(cpu):.3f}-{max(cpu):.3f}); budget x{BUDGET[name]}")
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}; {a.pairs} pairs of "
          f"{a.steps} steps")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
