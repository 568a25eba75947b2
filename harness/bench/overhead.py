"""Benchmark: the harness's per-test overhead against spawn-per-test and a bare loop.

``collective-bench`` (or ``python -m harness.bench``) measures, for each world size, on Gloo
with a trivial collective (all_reduce of 4 float32):

- harness: instances run through a persistent rank pool (the path every pytest item takes,
  including building buffers, the reference check and the verdict), pool start amortized
  (the forkserver, started once per session, is measured and reported apart);
- pytest: the same instances as a generated case file run by ``pytest`` in a subprocess
  (whole session: interpreter start, collection, pool start, reports), per instance;
- spawn: a fresh process group per test, written like PyTorch's ``MultiProcessTestCase``
  (spawn ranks, import torch, rendezvous, one collective, tear down);
- bare: the collective alone in a loop inside one process group (the floor);

and the time from a hang's deadline to its report, and what a rejected call costs over an
accepted one (the verdict and the pool's health check included). Ratios are printed side by
side. The targets: amortized overhead at world size 2 under 10 ms and over 400x faster than
spawn-per-test; a hang reported within deadline + 3 s (issue 3); a rejected call at world
size 2 at most 5 ms more than an accepted one (issue 10).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..casefile import collect
from ..errors import float_in, int_in
from ..report import costs
from ..report.jsonfile import UnreadableFile, unwritable
from ..report.records import load_report
from ..run.forkserver import forkserver_context
from ..runner.execute import Runner
from ..runner.settings import RunSettings
from . import busbw as busbw_bench


@dataclass
class Row:
    """Results for one world size (seconds per test unless noted)."""

    world_size: int
    harness_s: float
    steady_s: float
    pytest_s: float
    spawn_s: float
    bare_s: float
    pool_start_s: float

    @property
    def overhead_s(self) -> float:
        return max(0.0, self.harness_s - self.bare_s)


def _case_text(world_size: int, n: int) -> str:
    return textwrap.dedent(f"""
    cases:
      - name: bench
        op: all_reduce
        world_size: {world_size}
        params: {{seq: {list(range(n))}}}
        shape: [4]
        input: "rank + i + seq"
    """)


def _instances(world_size: int, n: int) -> list[Any]:
    return collect.from_text(_case_text(world_size, n), "bench.yaml", "gloo")


def _runner(deadline_s: float = 60.0) -> Runner:
    """A runner as a pytest session makes one (one pool), its capabilities read already."""
    runner = Runner(RunSettings(deadline_s=deadline_s), max_pools=1)
    _ = runner.caps  # read once per session, before anything is timed
    return runner


def _noop() -> None:
    pass


def warm_forkserver() -> float:
    """Start the forkserver (torch preloaded): once per pytest session, not per pool."""
    ctx = forkserver_context()
    t0 = time.perf_counter()
    proc = ctx.Process(target=_noop)
    proc.start()
    proc.join(120)
    return time.perf_counter() - t0


def bench_harness(world_size: int, n: int) -> tuple[float, float, float]:
    """Seconds per instance (pool start amortized; steady state), and the pool start."""
    insts = _instances(world_size, n)
    runner = _runner()
    try:
        t0 = time.perf_counter()
        runner.manager.get(runner.key(insts[0]))
        t_start = time.perf_counter() - t0
        for inst in insts:  # the path of every pytest item: prepare, run, judge, settle
            result = runner.execute(runner.prepare(inst)).result
            if result.outcome != "passed":
                raise RuntimeError(f"benchmark instance failed: {result.message}")
        total = time.perf_counter() - t0
    finally:
        runner.close()
    return total / n, (total - t_start) / n, t_start


def bench_pytest(world_size: int, n: int) -> float:
    """Seconds per instance for a whole ``pytest`` session over ``n`` instances."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.yaml")
        with open(path, "w") as fh:
            fh.write(_case_text(world_size, n))
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "--no-report", path], cwd=tmp, capture_output=True, text=True,
                             timeout=1800)
        elapsed = time.perf_counter() - t0
    if out.returncode != 0 or f"{n} passed" not in out.stdout:
        raise RuntimeError(f"pytest benchmark failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return elapsed / n


def _spawn_rank(rank: int, world_size: int, store_path: str) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size),  # type: ignore[attr-defined]
                            rank=rank, world_size=world_size, timeout=dt.timedelta(seconds=120))
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t)
    dist.destroy_process_group()


def bench_spawn(world_size: int, reps: int) -> float:
    """Seconds per test when every test spawns, initialises and tears down its ranks."""
    ctx = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            procs = [ctx.Process(target=_spawn_rank, args=(r, world_size,
                                                           os.path.join(tmp, "store")))
                     for r in range(world_size)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(300)
                if p.exitcode != 0:
                    raise RuntimeError(f"spawned rank exited with {p.exitcode}")
    return (time.perf_counter() - t0) / reps


def _bare_rank(rank: int, world_size: int, store_path: str, n: int, conn: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size),  # type: ignore[attr-defined]
                            rank=rank, world_size=world_size)
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    conn.send((time.perf_counter() - t0) / n)
    dist.destroy_process_group()


def bench_bare(world_size: int, n: int) -> float:
    """Seconds per collective in a plain loop inside one process group."""
    ctx = forkserver_context()
    with tempfile.TemporaryDirectory() as tmp:
        pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
        procs = [ctx.Process(target=_bare_rank, args=(r, world_size, os.path.join(tmp, "store"),
                                                      n, pipes[r][1]))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        times = [float(recv.recv()) for recv, _ in pipes]
        for p in procs:
            p.join(60)
    return max(times)


def bench_hang(deadline_s: float) -> float:
    """Seconds from the deadline to the hang report, for a receive that never completes."""
    cases = collect.cases_of_text(textwrap.dedent("""
    cases:
      - name: hang
        world_size: 2
        tensors: {t: {shape: [2], init: zeros}}
        steps:
          - {op: recv, tensor: t, src: 0, ranks: [1]}
        expected: {}
        hangs: true
    """), "hang.yaml")
    (inst,) = collect.instances(cases, "gloo", "hang.yaml")
    runner = _runner(deadline_s)
    try:
        prepared = runner.prepare(inst)
        runner.manager.get(runner.key(inst))
        t0 = time.perf_counter()
        judged = runner.execute(prepared)
        elapsed = time.perf_counter() - t0
    finally:
        runner.close()
    run = judged.run
    if run is None or run.kind != "hang" or not any(s.stack for s in run.states):
        raise RuntimeError(f"expected a diagnosed hang, got {judged.result.outcome}")
    return elapsed - deadline_s


@dataclass
class Rejection:
    """Accepted vs rejected calls through the plugin's path (run, verdict, pool upkeep)."""

    world_size: int
    accepted_s: float  # median seconds per accepted instance
    rejected_s: float  # median seconds per rejected instance
    pools_started: int

    @property
    def extra_s(self) -> float:
        return self.rejected_s - self.accepted_s


def bench_rejection(world_size: int, n: int) -> Rejection:
    """Alternate an accepted all_reduce with one every rank rejects (BXOR on float32)."""
    cases = collect.cases_of_text(textwrap.dedent(f"""
    cases:
      - name: accepted
        op: all_reduce
        world_size: {world_size}
        shape: [4]
        input: "rank + i"
      - name: rejected
        op: all_reduce
        world_size: {world_size}
        reduce_op: bxor
        shape: [4]
        input: "rank + i"
        raises: "BXOR|non-integral|not supported"
    """), "rejection.yaml")
    insts = {i.case: i for i in collect.instances(cases, "gloo", "rejection.yaml")}
    times: dict[str, list[float]] = {"accepted": [], "rejected": []}
    runner = _runner()
    manager = runner.manager
    try:
        prepared = {name: runner.prepare(inst) for name, inst in insts.items()}
        manager.get(runner.key(next(iter(insts.values()))))
        for _ in range(n):
            for name, ready in prepared.items():
                t0 = time.perf_counter()
                outcome = runner.execute(ready).result.outcome
                times[name].append(time.perf_counter() - t0)
                if outcome != "passed":
                    raise RuntimeError(f"rejection benchmark: {name} was {outcome}")
    finally:
        runner.close()
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return Rejection(world_size, med["accepted"], med["rejected"], manager.started)


def costs_main(argv: list[str]) -> int:
    """``collective-bench --costs REPORT``: the top cost centres of a run (its phases, the
    costliest case files) from the JSON report it wrote."""
    if len(argv) != 1:
        print("usage: collective-bench --costs REPORT.json", file=sys.stderr)
        return 2
    try:
        report = load_report(argv[0])
    except UnreadableFile as exc:  # load_report's only error: one line naming the file
        print(f"collective-bench: {exc}", file=sys.stderr)
        return 2
    print(costs.render(report), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a Markdown table (and JSON with --json)."""
    rest = sys.argv[1:] if argv is None else argv
    if "--busbw" in rest:  # the perf mode against a bare loop: its own options
        return busbw_bench.main([a for a in rest if a != "--busbw"])
    if rest and rest[0] == "--costs":  # where a run's time went, from its report
        return costs_main(rest[1:])
    ap = argparse.ArgumentParser(prog="collective-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,4,8")
    ap.add_argument("--instances", type=int_in(1, 1_000_000), default=300,
                    help="instances per world size")
    ap.add_argument("--spawn-reps", type=int_in(1, 1000), default=3,
                    help="spawn-per-test repetitions")
    ap.add_argument("--hang-deadline", type=float_in(0, 600, open_low=True), default=2.0)
    ap.add_argument("--no-pytest", action="store_true", help="skip the whole-session column")
    ap.add_argument("--rejections", type=int_in(1, 1_000_000), default=200,
                    help="accepted/rejected pairs for the rejection cost (world size 2)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    why = unwritable(args.json, "--json file") if args.json else ""
    if why:  # refused before minutes of measuring, not after
        print(f"collective-bench: error: {why}", file=sys.stderr)
        return 2
    rows: list[Row] = []
    forkserver_s = warm_forkserver()
    for ws in (int(x) for x in args.world_sizes.split(",")):
        per, steady, start = bench_harness(ws, args.instances)
        py = float("nan") if args.no_pytest else bench_pytest(ws, args.instances)
        spawn = bench_spawn(ws, max(1, args.spawn_reps if ws <= 4 else 1))
        bare = bench_bare(ws, args.instances)
        rows.append(Row(ws, per, steady, py, spawn, bare, start))
        print(f"ws{ws}: harness {per * 1e3:.2f} ms, pytest {py * 1e3:.2f} ms, spawn "
              f"{spawn:.2f} s, bare {bare * 1e3:.3f} ms", file=sys.stderr, flush=True)
    hang_extra = bench_hang(args.hang_deadline)
    rej = bench_rejection(2, args.rejections)
    import torch

    lines = [
        f"collective-bench: Gloo/CPU, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{args.instances} instances per world size, all_reduce of 4 float32",
        "",
        "| world size | harness ms/test (amortized) | steady ms/test | overhead ms/test | "
        "pytest session ms/test | spawn-per-test s/test | bare ms/op | pool start s | "
        "spawn / harness |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.world_size} | {r.harness_s * 1e3:.2f} | {r.steady_s * 1e3:.2f} | "
                     f"{r.overhead_s * 1e3:.2f} | "
                     f"{r.pytest_s * 1e3:.2f} | {r.spawn_s:.2f} | {r.bare_s * 1e3:.3f} | "
                     f"{r.pool_start_s:.2f} | {r.spawn_s / r.harness_s:.0f}x |")
    lines += ["", f"forkserver start (once per session, not in the columns): {forkserver_s:.2f} s",
              f"hang reported {hang_extra:.2f} s after a {args.hang_deadline:g} s deadline",
              f"rejected call at world size 2: {rej.rejected_s * 1e3:.2f} ms vs accepted "
              f"{rej.accepted_s * 1e3:.2f} ms (median of {args.rejections} each): "
              f"{rej.extra_s * 1e3:+.2f} ms (target: at most +5 ms); pools started: "
              f"{rej.pools_started}"]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"created": datetime.datetime.now(datetime.UTC).isoformat(),
                       "torch": str(torch.__version__), "cpus": os.cpu_count(),
                       "instances": args.instances,
                       "rows": [{**asdict(r), "overhead_s": r.overhead_s} for r in rows],
                       "forkserver_start_s": forkserver_s,
                       "hang_report_after_deadline_s": hang_extra,
                       "rejection": {**asdict(rej), "extra_s": rej.extra_s}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
