"""Benchmark: generated instances per second of collective-fuzz at world size 2 on Gloo.

    python ci/fuzz_bench.py [--examples 1000] [--seed 0] [--lanes 1] [--profile OUT.pstats]

Runs the fuzzer in process (the CLI's own executor and engine, the bundled overrides
applied) at ``--world-size 2`` with a warm pool, and prints instances per second, the
pool start excluded and included, with the machine's load (os.getloadavg) so the figure can
be read against it. Only instances actually run on the ranks and judged count (those run
while shrinking included, and said). Also printed: the CPU time per instance of the parent
(this process) and of the ranks (the forkserver's children: live ranks plus the ranks it
has reaped), which depend far less on the machine's load than the rate. ``--lanes N`` runs
it as ``collective-fuzz --lanes N`` does (batches of instances on N executors at once).
Target: at least 50 per second. A benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing.forkserver
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
from harness.fuzz.lanes import Lanes  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    return text[text.rindex(")") + 2:].split()  # fields from 3 (state) on


def ranks_cpu_s() -> float:
    """CPU seconds of every rank process so far: the forkserver's reaped children plus its
    live ones (Linux /proc; 0.0 elsewhere)."""
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if server is None or not os.path.exists("/proc"):
        return 0.0
    try:
        fields = _stat(server)
    except OSError:
        return 0.0
    total = int(fields[13]) + int(fields[14])  # cutime + cstime: reaped ranks
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            f = _stat(int(entry))
        except OSError:
            continue
        if int(f[1]) == server:  # ppid
            total += int(f[11]) + int(f[12])  # utime + stime
    return total / TICK


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="", help="write a cProfile of the fuzzing loop here")
    ap.add_argument("--lanes", type=int, default=1, help="collective-fuzz --lanes N")
    args = ap.parse_args()
    threads = os.environ.get("OMP_NUM_THREADS") or "1"  # the ranks' (harness.run.pool)
    library, _ = load_library([str(ROOT / "cases")])
    known = KnownLibrary(library)
    executors = [Executor("gloo", (), 5.0, known, max_pools=1) for _ in range(args.lanes)]
    ex = executors[0]
    lanes = Lanes(executors) if args.lanes > 1 else None
    t0 = time.monotonic()
    for e in executors:
        e.run_text(space.render_case({"name": "warm", "op": "barrier", "world_size": 2}))
    start_s = time.monotonic() - t0
    prof = cProfile.Profile() if args.profile else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            fz = Fuzzer(ex, space.DEFAULT_OPS, (2,), args.seed,
                        Budget(examples=args.examples, shrink_s=10.0), Path(tmp) / "db",
                        lanes=lanes)
            c0, r0 = os.times(), ranks_cpu_s()
            t1 = time.monotonic()
            if prof is not None:
                prof.enable()
            fz.run()
            if prof is not None:
                prof.disable()
            took = time.monotonic() - t1
            c1, r1 = os.times(), ranks_cpu_s()
    finally:
        if lanes is not None:
            lanes.close()
        ex.close()
    if prof is not None:
        prof.dump_stats(args.profile)
    s = fz.stats
    n = max(1, s.tried)
    parent_ms = 1000 * ((c1.user - c0.user) + (c1.system - c0.system)) / n
    ranks_ms = 1000 * (r1 - r0) / n
    load = os.getloadavg()
    print(f"collective-fuzz rate at world size 2 (gloo, {os.cpu_count()} cores, load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}): {s.tried / took:.1f} instances/s "
          f"({s.tried} instances run and judged, {s.shrinking} of them while shrinking, "
          f"{len(fz.findings)} finding(s), {took:.1f} s); pool start {start_s:.1f} s; with it "
          f"{s.tried / (took + start_s):.1f}/s; target 50/s")
    print(f"CPU per instance: parent {parent_ms:.1f} ms, ranks {ranks_ms:.1f} ms (all ranks "
          f"together; {sum(e.manager.started for e in executors)} pool(s) started; "
          f"OMP_NUM_THREADS={threads}; {args.lanes} lane(s))")
    print("instances by op: " + ", ".join(f"{k} {v}" for k, v in sorted(s.by_op.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
