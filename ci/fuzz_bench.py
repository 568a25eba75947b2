"""Benchmark: generated instances per second of collective-fuzz at world size 2 on Gloo.

    python ci/fuzz_bench.py [--examples 1000] [--seed 0]

Runs the fuzzer in process (the CLI's own executor and engine, the bundled overrides
applied) at ``--world-size 2`` with a warm pool, and prints instances per second, the
pool start excluded and included, with the machine's load (os.getloadavg) so the figure can
be read against it. Target: at least 50 per second. A benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.fuzz import space  # noqa: E402
from harness.fuzz.engine import Budget, Fuzzer  # noqa: E402
from harness.fuzz.execute import Executor  # noqa: E402
from harness.fuzz.known import KnownLibrary, load_library  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    library, _ = load_library([str(ROOT / "cases")])
    ex = Executor("gloo", (), 5.0, KnownLibrary(library), max_pools=1)
    t0 = time.monotonic()
    ex.run_text(space.render_case({"name": "warm", "op": "barrier", "world_size": 2}))
    start_s = time.monotonic() - t0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            fz = Fuzzer(ex, space.DEFAULT_OPS, (2,), args.seed,
                        Budget(examples=args.examples, shrink_s=10.0), Path(tmp) / "db")
            t1 = time.monotonic()
            fz.run()
            took = time.monotonic() - t1
    finally:
        ex.close()
    s = fz.stats
    load = os.getloadavg()
    print(f"collective-fuzz rate at world size 2 (gloo, {os.cpu_count()} cores, load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}): {s.tried / took:.1f} instances/s "
          f"({s.tried} instances, {s.shrinking} while shrinking, {len(fz.findings)} "
          f"finding(s), {took:.1f} s); pool start {start_s:.1f} s; with it "
          f"{s.tried / (took + start_s):.1f}/s; target 50/s")
    print("instances by op: " + ", ".join(f"{k} {v}" for k, v in sorted(s.by_op.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
