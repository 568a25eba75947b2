"""The cost of collective-record (issue 28 point 6), measured.

    python ci/bench/bench_record.py [--pairs 10] [--steps 100] [--call-pairs 6] [--json PATH]

* overhead: a DDP training step (the model of ``examples/ddp_buckets.py`` as shipped, Gloo,
  2 ranks, ``bucket_cap_mb=1``) with and without the recorder. Each run starts 2 fresh ranks,
  runs ``--warmup`` untimed steps, then ``--steps`` timed steps back to back (no barrier
  inside: each step's recording work is in its time). Runs come in pairs whose order
  alternates (plain first, then recorded first, ...) so that drift in the machine's load hits
  both sides. Two figures per pair: rank 0's median step time (wall), and the CPU time both
  rank processes spent per step (``time.process_time``: every thread, Gloo's and the
  recorder's flusher included; much less sensitive to other processes than wall time). Each
  is reported as the median, interquartile range and range of the per-pair ratios. Budget:
  +5 % on the wall figure.
* overhead, one launch (``--block-pairs``, ``--block-steps``): the same step in one recorded
  launch, blocks of steps with the recorder's kernels detached (``hook.detach()``: the
  dispatcher as without it) and attached in turn, adjacent blocks in alternating order: no
  process start between the two sides of a pair.
* per call: ``--call-count`` all_reduces of ``--numel`` floats (the DDP example's larger
  bucket) per rank, with and without the recorder, issued two ways (as DDP's Reducer does:
  ``ProcessGroup.allreduce`` waited on its future; and ``dist.all_reduce`` + ``Work.wait``,
  which adds a wait record). The added CPU time per call, of the issuing thread (where the
  hook runs) and of the whole process, over ``--call-pairs`` alternating pairs. The process
  figure includes Gloo's worker threads, whose time depends on how long each waits for the
  other rank, and spreads over hundreds of us; the issuing thread's is the one used: times the
  DDP run's recorded calls per step over its plain step time, it is a second, independent
  estimate of the overhead.
* collapse: ``--calls`` recorded calls (DDP-like all_reduces over a handful of bucket
  shapes, broadcasts, p2p pairs; 2 ranks) written as per-rank trace files, then read,
  translated and written as a case file by the same functions the command uses. Budget 10 s.

Prints each figure with the load average; exits 1 when a budget is missed (a benchmark, not a
test: CI does not run it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.record.cases import Recording, render  # noqa: E402
from harness.record.cli import ENV, SITE, translate_traces  # noqa: E402
from harness.record.trace import FORMAT, HOOK_ENV, VERSION, read_folder  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_record_workers import CALLS, STEP  # noqa: E402


def _spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and range of a sample (the quartiles by the inclusive method)."""
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values),
            "max": max(values), "n": float(len(values))}


def _run(folder: Path, worker: str, args: list[str], record: bool) -> list[dict[str, Any]]:
    """One launch of a 2-rank worker; each rank's JSON result."""
    script = folder / "worker.py"
    script.write_text(worker)
    out = folder / "result"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT)])}
    env.pop(ENV, None)
    if record:
        traces = folder / "traces"
        shutil.rmtree(traces, ignore_errors=True)
        traces.mkdir()
        env[ENV] = str(traces)
    subprocess.run([sys.executable, str(script), *args, str(out)], env=env, check=True,
                   timeout=900, capture_output=True)
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]


def _pairs(pairs: int, worker: str, args: list[str]
           ) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """(plain, recorded) results of ``pairs`` pairs of runs whose order alternates, so that
    drift in the machine's load hits both sides."""
    got = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            run = {rec: _run(Path(tmp), worker, args, rec) for rec in order}
            got.append((run[False], run[True]))
    return got


def overhead(pairs: int, warmup: int, steps: int) -> dict[str, Any]:
    """The DDP step with and without the recorder: per pair, the ratio of rank 0's median step
    time (wall) and the ratio of the CPU time both rank processes spent per step."""
    runs = _pairs(pairs, STEP, [str(warmup), str(steps), "0"])
    wall = [rec[0]["median_s"] / plain[0]["median_s"] for plain, rec in runs]
    cpu = [sum(r["cpu_s"] for r in rec) / sum(r["cpu_s"] for r in plain) for plain, rec in runs]
    return {"plain_step_ms": statistics.median(p[0]["median_s"] for p, _ in runs) * 1e3,
            "recorded_step_ms": statistics.median(r[0]["median_s"] for _, r in runs) * 1e3,
            "plain_cpu_ms": statistics.median(sum(x["cpu_s"] for x in p) for p, _ in runs) * 1e3,
            "recorded_cpu_ms": statistics.median(sum(x["cpu_s"] for x in r) for _, r in runs)
            * 1e3,
            "calls_per_step": statistics.median(r[0]["calls"] for _, r in runs),
            "wall_ratio": _spread(wall), "cpu_ratio": _spread(cpu)}


def interleaved(pairs: int, warmup: int, steps: int) -> dict[str, Any]:
    """The DDP step in one recorded launch, blocks of ``steps`` steps with the recorder's
    kernels detached and attached in turn (adjacent blocks seconds apart, no process start
    between them): per pair of blocks, the ratio of rank 0's median step time and of both
    ranks' CPU time per step."""
    with tempfile.TemporaryDirectory() as tmp:
        ranks = _run(Path(tmp), STEP, [str(warmup), str(steps), str(pairs)], True)
    wall = [p[1] / p[0] for p in ranks[0]["pairs"]]
    cpu = [(a[3] + b[3]) / (a[2] + b[2]) for a, b in zip(*(r["pairs"] for r in ranks),
                                                         strict=True)]
    return {"plain_step_ms": statistics.median(p[0] for p in ranks[0]["pairs"]) * 1e3,
            "recorded_step_ms": statistics.median(p[1] for p in ranks[0]["pairs"]) * 1e3,
            "wall_ratio": _spread(wall), "cpu_ratio": _spread(cpu)}


def per_call(pairs: int, calls: int, numel: int) -> dict[str, Any]:
    """The recorder's added CPU time per all_reduce of ``numel`` floats, both ways of calling:
    per pair, recorded minus plain, of the issuing thread's median per-call CPU time (the
    hook runs there) and of the whole rank process's (every thread, the flusher's writes
    included), averaged over the 2 ranks."""
    runs = _pairs(pairs, CALLS, [str(calls), str(numel)])
    got: dict[str, Any] = {}

    def each(way: str, key: str, side: int) -> list[float]:
        return [sum(r[way][key] for r in pair[side]) / 2 for pair in runs]

    for way in ("ddp", "api"):
        got[way] = {"plain_thread_us": statistics.median(each(way, "thread_median_s", 0)) * 1e6,
                    "plain_process_us": statistics.median(each(way, "process_s", 0)) * 1e6}
        for key, name in (("thread_median_s", "thread"), ("process_s", "process")):
            diff = [(r - p) * 1e6
                    for p, r in zip(each(way, key, 0), each(way, key, 1), strict=True)]
            got[way][f"added_{name}_us"] = _spread(diff)
    return got


def _fmt(s: dict[str, float], scale: float = 1.0, pct: bool = False) -> str:
    f = (lambda v: f"{(v - 1) * 100:+.1f} %") if pct else (lambda v: f"{v * scale:.1f}")
    return (f"median {f(s['median'])}, IQR {f(s['q1'])} .. {f(s['q3'])}, range {f(s['min'])}"
            f" .. {f(s['max'])} (n={int(s['n'])})")


def _write_traces(folder: Path, calls: int) -> None:
    shapes = [[65792], [394752], [262144], [131072], [1024]]
    for rank in (0, 1):
        lines = [json.dumps({"header": {"format": FORMAT, "version": VERSION, "torch": "x",
                                        "rank": rank, "world_size": 2}})]
        for seq in range(calls // 2):
            k = seq % 10
            if k < 8:
                call = {"op": "c10d::allreduce_", "group": [0, 1], "reduce_op": "sum",
                        "args": {"tensors": [{"shape": shapes[seq % 5], "stride": [1],
                                              "contiguous": True, "dtype": "float32",
                                              "device": "cpu", "layout": "strided"}],
                                 "async_op": True},
                        "api": None, "site": f"/work/train.py:{40 + seq % 3}"}
            elif k == 8:
                call = {"op": "c10d::broadcast_", "group": [0, 1],
                        "args": {"tensors": [{"shape": [13], "dtype": "int32",
                                              "device": "cpu"}], "root_rank": 0,
                                 "async_op": False}, "api": "broadcast",
                        "site": "/work/train.py:30"}
            else:
                op = "c10d::send" if rank == 0 else "c10d::recv_"
                peer = {"dst": 1} if rank == 0 else {"src": 0}
                call = {"op": op, "group": [0, 1], "args": {
                    "tensors": [{"shape": [16, 256], "dtype": "float32", "device": "cpu"}],
                    "tag": 0, **peer}, "api": "isend" if rank == 0 else "irecv",
                    "site": "/work/pipe.py:12"}
            lines.append(json.dumps({"call": {**call, "seq": seq}}))
            if k == 8:
                lines.append(json.dumps({"wait": {"call": seq, "what": "work", "after": seq + 1,
                                                  "site": "/work/train.py:31"}}))
        lines.append(json.dumps({"end": {"calls": calls // 2}}))
        (folder / f"trace-{rank}.jsonl").write_text("\n".join(lines) + "\n")


def collapse(calls: int) -> dict[str, float]:
    """Seconds from per-rank trace files to the case file's text."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write_traces(folder, calls)
        t0 = time.perf_counter()
        traces = read_folder(folder)
        t1 = time.perf_counter()
        got, _ = translate_traces(traces, skip_unknown=False)
        t2 = time.perf_counter()
        text = render(Recording(world_size=2, calls=got, source="bench"))
        t3 = time.perf_counter()
    return {"calls": float(len(got)), "read_s": t1 - t0, "translate_s": t2 - t1,
            "render_s": t3 - t2, "total_s": t3 - t0, "case_file_bytes": float(len(text))}


WAYS = {"ddp": "ProcessGroup.allreduce + future wait, as DDP",
        "api": "dist.all_reduce + Work.wait"}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=10, help="plain/recorded pairs of DDP runs")
    p.add_argument("--warmup", type=int, default=10, help="untimed DDP steps per run")
    p.add_argument("--steps", type=int, default=100, help="timed DDP steps per run")
    p.add_argument("--block-pairs", type=int, default=20,
                   help="detached/attached pairs of step blocks in one recorded launch")
    p.add_argument("--block-steps", type=int, default=50, help="DDP steps per block")
    p.add_argument("--call-pairs", type=int, default=6, help="pairs of per-call runs")
    p.add_argument("--call-count", type=int, default=2000, help="all_reduces per way per run")
    p.add_argument("--numel", type=int, default=263168,
                   help="floats per all_reduce: the DDP example's larger bucket")
    p.add_argument("--calls", type=int, default=100_000, help="calls for the collapse")
    p.add_argument("--skip", default="",
                   help="comma list of: overhead, blocks, calls, collapse")
    p.add_argument("--hook", choices=["native", "python"], default="native",
                   help="the kernel the recorded ranks use (native: the C++ one, as "
                        "collective-record uses where it builds)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if a.hook == "native":
        from harness.record import native
        native.load()  # built before any timing (cached after the first time)
    os.environ[HOOK_ENV] = a.hook
    skip = set(filter(None, a.skip.split(",")))
    out: dict[str, Any] = {"loadavg_before": list(os.getloadavg()), "cpus": os.cpu_count(),
                           "hook": a.hook}
    print(f"load average before: {_load()} ({os.cpu_count()} CPUs); hook: {a.hook}")
    ok = True
    if "collapse" not in skip:
        c = collapse(a.calls)
        out["collapse"] = c
        ok &= c["total_s"] < 10
        print(f"collapse: {int(c['calls'])} calls -> case file in {c['total_s']:.2f} s "
              f"(read {c['read_s']:.2f}, translate {c['translate_s']:.2f}, render "
              f"{c['render_s']:.2f}; {int(c['case_file_bytes'])} bytes)  budget < 10 s"
              f"  [load {_load()}]")
    if "calls" not in skip:
        pc = per_call(a.call_pairs, a.call_count, a.numel)
        out["per_call"] = pc
        for way, g in pc.items():
            print(f"per call ({WAYS[way]}, "
                  f"{a.numel} floats): plain {g['plain_thread_us']:.1f} us issuing-thread CPU"
                  f", {g['plain_process_us']:.1f} us process CPU")
            print(f"  added, issuing thread: {_fmt(g['added_thread_us'])} us")
            print(f"  added, rank process:   {_fmt(g['added_process_us'])} us"
                  f"  [load {_load()}]")
    if "blocks" not in skip:
        b = interleaved(a.block_pairs, a.warmup, a.block_steps)
        out["blocks"] = b
        ok &= b["wall_ratio"]["median"] <= 1.05
        print(f"overhead, one launch: DDP step, {a.block_pairs} pairs of {a.block_steps}-step "
              f"blocks, recorder detached / attached: plain {b['plain_step_ms']:.2f} ms, "
              f"recorded {b['recorded_step_ms']:.2f} ms")
        print(f"  step time (rank 0 median per block), per pair: "
              f"{_fmt(b['wall_ratio'], pct=True)}  budget <= +5 %")
        print(f"  CPU per step (both ranks), per pair: {_fmt(b['cpu_ratio'], pct=True)}"
              f"  [load {_load()}]")
    if "overhead" not in skip:
        o = overhead(a.pairs, a.warmup, a.steps)
        out["overhead"] = o
        ok &= o["wall_ratio"]["median"] <= 1.05
        print(f"overhead, separate launches: DDP step (examples/ddp_buckets.py's model, "
              f"bucket_cap_mb=1, 2 ranks Gloo), {a.pairs} pairs x {a.steps} steps after "
              f"{a.warmup}: plain "
              f"{o['plain_step_ms']:.2f} ms, recorded {o['recorded_step_ms']:.2f} ms; "
              f"{o['calls_per_step']:.1f} recorded calls per step")
        print(f"  step time (rank 0 median), recorded/plain per pair: "
              f"{_fmt(o['wall_ratio'], pct=True)}  budget <= +5 %")
        print(f"  CPU per step (both ranks; plain {o['plain_cpu_ms']:.2f} ms, recorded "
              f"{o['recorded_cpu_ms']:.2f} ms), per pair: {_fmt(o['cpu_ratio'], pct=True)}"
              f"  [load {_load()}]")
        if "per_call" in out:
            us = out["per_call"]["ddp"]["added_thread_us"]["median"]
            est = o["calls_per_step"] * us / (o["plain_step_ms"] * 1e3) * 100
            out["estimate_pct"] = est
            print(f"  estimate: {o['calls_per_step']:.1f} calls/step x {us:.1f} us added per "
                  f"call (issuing thread) / {o['plain_step_ms']:.2f} ms = {est:+.1f} %")
    out["loadavg_after"] = list(os.getloadavg())
    print(f"load average after: {_load()}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
