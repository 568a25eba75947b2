"""Benchmark: generated instances per second of collective-fuzz at world size 2 on Gloo.

    python ci/bench/fuzz_bench.py [--examples 1000 | --time 60] [--seed 0] [--lanes 1]
                            [--profile OUT.pstats]

Runs the fuzzer as ``collective-fuzz --backend gloo --world-size 2 --shrink-time 10s`` runs
it (the bundled overrides applied): one lane in this process, ``--lanes N`` as N worker
processes coordinated from this one (harness.fuzz.lanes). Every pool is started first (a
barrier in each lane; with lanes, they all start fuzzing together once every lane is warm),
and instances per second are printed with the start excluded and included, with the
machine's load (os.getloadavg) so the figure can be read against it. Only instances actually
run on the ranks and judged count (those run while shrinking included, and said); with lanes
the time ends when the last lane sends its final tally (before it closes its pools). With
``--examples`` each lane has a fixed share, so the run lasts as long as its slowest lane (one
that shrinks findings); ``--time S`` (seconds) gives every lane the same time instead, as a
long ``collective-fuzz --time`` run does.

Also printed: the CPU time per instance of the fuzzer processes (this one, plus every
worker's from its start of fuzzing to its tally) and of the rank side (each fuzzer's
descendants: forkserver, ranks, capability probes, and the ranks they reaped), which depend
far less on the machine's load than the rate. ``--profile`` (one lane only) writes a cProfile
of the fuzzing loop. Target: at least 50 per second. A benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.fuzz.lanes import Coordinator  # noqa: E402
from harness.fuzz.options import check, parser  # noqa: E402
from harness.fuzz.session import Session  # noqa: E402
from harness.fuzz.summary import Tally  # noqa: E402
from harness.fuzz.worker import descendants_cpu_s  # noqa: E402


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def one_lane(args: argparse.Namespace, profile: str) -> tuple[Tally, float, float, float,
                                                              float, int, int]:
    """In process: tally, start s, fuzzing s, fuzzer CPU s, ranks CPU s, pools, findings."""
    t0 = time.monotonic()
    session = Session(args, check(args))
    prof = cProfile.Profile() if profile else None
    try:
        session.warm()
        session.start_clock()
        start_s = time.monotonic() - t0
        c0, r0 = _cpu(), descendants_cpu_s(os.getpid())
        t1 = time.monotonic()
        if prof is not None:
            prof.enable()
        session.run()
        if prof is not None:
            prof.disable()
        took = time.monotonic() - t1
        cpu, ranks = _cpu() - c0, descendants_cpu_s(os.getpid()) - r0
        pools = sum(e.manager.started for e in session.executors)
    finally:
        session.close()
    if prof is not None:
        prof.dump_stats(profile)
    return (session.tally(), start_s, took, cpu, ranks, pools,
            len(session.fuzzer.findings))


def many_lanes(args: argparse.Namespace, argv: list[str]) -> tuple[Tally, float, float, float,
                                                              float, int, int, str]:
    """Worker processes: the same figures, and the instances of each lane."""
    t0 = time.monotonic()
    co = Coordinator(args, argv, warm=True)
    co.start()
    co.wait_ready()
    start_s = time.monotonic() - t0
    c0 = _cpu()
    t1 = time.monotonic()
    co.go()
    co.run()
    ends = [lane.ended_at for lane in co.lanes if lane.ended_at is not None]
    if co.failed() or len(ends) != len(co.lanes):
        raise SystemExit(f"fuzz_bench: a lane failed: {co.summary(None)}")
    took = max(ends) - t1
    cpu = _cpu() - c0 + sum(lane.cpu_s for lane in co.lanes)
    ranks = sum(lane.ranks_cpu_s for lane in co.lanes)
    per_lane = ", ".join(f"lane {lane.index} {lane.tally.stats.tried}" for lane in co.lanes)
    return (co.tally(), start_s, took, cpu, ranks,
            sum(lane.pools_started for lane in co.lanes), len(co.findings), per_lane)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--time", type=float, default=0.0, help="seconds per lane, instead of "
                    "--examples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="", help="write a cProfile of the fuzzing loop here "
                    "(one lane only)")
    ap.add_argument("--lanes", type=int, default=1, help="collective-fuzz --lanes N")
    opts = ap.parse_args()
    if opts.profile and opts.lanes > 1:
        ap.error("--profile profiles this process: give it with one lane only")
    threads = os.environ.get("OMP_NUM_THREADS") or "1"  # the ranks' (harness.run.pool)
    with tempfile.TemporaryDirectory() as tmp:
        budget = (["--time", f"{opts.time}s"] if opts.time
                  else ["--examples", str(opts.examples)])
        argv = ["--backend", "gloo", "--world-size", "2", *budget, "--seed", str(opts.seed),
                "--shrink-time", "10s", "--out", tmp, "--lanes", str(opts.lanes), "-q"]
        args = parser().parse_args(argv)
        check(args)
        per_lane = ""
        if opts.lanes == 1:
            tally, start_s, took, cpu, ranks, pools, found = one_lane(args, opts.profile)
        else:
            tally, start_s, took, cpu, ranks, pools, found, per_lane = many_lanes(args, argv)
    s = tally.stats
    n = max(1, s.tried)
    load = os.getloadavg()
    print(f"collective-fuzz rate at world size 2 (gloo, {os.cpu_count()} cores, load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}): {s.tried / took:.1f} instances/s "
          f"({s.tried} instances run and judged, {s.shrinking} of them while shrinking, "
          f"{found} finding(s), {took:.1f} s); start {start_s:.1f} s; with it "
          f"{s.tried / (took + start_s):.1f}/s; target 50/s")
    print(f"CPU per instance: fuzzer processes {1000 * cpu / n:.1f} ms, ranks "
          f"{1000 * ranks / n:.1f} ms (all ranks together; {pools} pool(s) started; "
          f"OMP_NUM_THREADS={threads}; {opts.lanes} lane(s){': ' + per_lane if per_lane else ''})")
    print("instances by op: " + ", ".join(f"{k} {v}" for k, v in sorted(s.by_op.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
