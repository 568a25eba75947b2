"""``collective-bench --busbw``: the perf mode against a bare ``torch.distributed`` loop.

For each op/size point of a case file (default ``cases/perf.yaml``, float32, sizes from
``--min-bytes`` up), on one rank pool per world size (Gloo/CPU by default; ``--backend``),
it times the point through the perf mode (the step interpreter's ``call_op``, as ``pytest
--perf`` does) and as a bare loop of the plain ``torch.distributed`` calls on the same process
group and the same buffers, waited in the case's order
(:func:`harness.program.perf.bare_iteration`). Inside the ranks the two alternate call by
call (:func:`harness.program.perf.timed_pair`), so a change in the machine's load hits both
sides of a pair. Per pair, the ratio harness busbw / bare busbw is bare time / harness time,
each the slowest rank's *median* time per call: on a shared machine a stall inside one call
moves a block's mean by tens of percent and its median hardly at all (the ratio of the mean
times, nccl-tests' definition of busbw, is kept beside it in the JSON and the table). The
table gives each point's median over all pairs, the interquartile range and the extremes
(how noisy the machine was), and per op the median over every pair of its sizes with a 95%
confidence interval: the figure the speed budget reads (docs/explanation/process-model.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import statistics
import sys
from typing import Any

from ..casefile import collect
from ..errors import CaseFileError, CaseFileErrors, float_in, int_in
from ..model import Instance, PerfPlan
from ..perf.plan import PerfSettings
from ..report.jsonfile import printable, unwritable
from ..runner.execute import Runner
from ..runner.settings import RunSettings


def points(path: str, backend: str, world_sizes: set[int], dtype: str, min_bytes: int,
           max_bytes: int, ops: set[str] | None) -> list[Instance]:
    """The instances of ``path`` to compare (one per op, form, world size and size)."""
    out: list[Instance] = []
    for inst in collect.from_file(path, backend):
        nbytes = dict(inst.params).get("bytes")
        if (inst.world_size in world_sizes and inst.dtype == dtype
                and isinstance(nbytes, int) and min_bytes <= nbytes <= max_bytes
                and (ops is None or inst.op in ops or inst.case.split("_")[0] in ops)):
            out.append(inst)
    return out


def measure(runner: Runner, inst: Instance) -> tuple[dict[str, Any], list[float], list[float]]:
    """Run ``inst`` (checks, then timing) once through the runner, as a ``--perf`` session
    does: its perf section, and per timed block pair the ratio harness busbw / bare busbw
    (= bare time / harness time, each the slowest rank's), from the mean time per call and
    from the median time per call."""
    judged = runner.execute(runner.prepare(inst))
    run, perf = judged.run, judged.result.perf
    if judged.result.outcome != "passed" or run is None or perf is None:
        raise RuntimeError(f"{inst.key}: the instance failed its check "
                           f"({judged.result.outcome}: {judged.result.message[:300]})")
    if "busbw_gbs" not in perf:
        raise RuntimeError(f"{inst.key}: not timed: {perf.get('not_timed')}")
    raw = [r.perf for r in run.results.values()]
    blocks = len(raw[0]["times_s"])

    def ratios(bare: str, harness: str) -> list[float]:
        return [max(p[bare][i] for p in raw) / max(p[harness][i] for p in raw)
                for i in range(blocks)]

    return perf, ratios("bare_times_s", "times_s"), ratios("bare_median_call_s",
                                                           "median_call_s")


def compare_point(runner: Runner, inst: Instance, runs: int) -> dict[str, Any]:
    """``runs`` runs of one point, each timing ``repeats`` pairs of alternating calls (the
    runner's perf loop has ``paired_bare`` set: see :func:`paired_runner`)."""
    ratios: list[float] = []
    means: list[float] = []
    h_bw: list[float] = []
    info: dict[str, Any] = {}
    for _ in range(runs):
        info, by_mean, by_median = measure(runner, inst)
        ratios += by_median
        means += by_mean
        h_bw.append(info["busbw_gbs"])
    ratio = statistics.median(ratios)
    harness_bw = statistics.median(h_bw)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratio, ratio, ratio]
    return {"key": inst.key, "op": info["op"], "form": info["form"],
            "world_size": inst.world_size, "bytes": info["bytes"],
            "harness_busbw_gbs": harness_bw, "bare_busbw_gbs": harness_bw / ratio,
            "ratio": ratio, "ratio_q1": q[0], "ratio_q3": q[2], "ratio_min": min(ratios),
            "ratio_max": max(ratios), "pairs": len(ratios), "ratios": ratios,
            "ratio_of_means": statistics.median(means), "ratios_of_means": means}


def paired_runner(backend: str, plan: PerfPlan) -> Runner:
    """A runner in performance mode whose loop alternates the harness's calls with a bare
    loop's (``paired_bare``), one pool at a time; deadline 300 s (large buffers)."""
    loop = dataclasses.replace(plan, paired_bare=True)
    return Runner(RunSettings(backend=backend, deadline_s=300.0,
                              perf=PerfSettings(enabled=True, loop=loop)), max_pools=1)


def by_op(rows: list[dict[str, Any]]) -> dict[tuple[int, str, str], list[float]]:
    """Every pair's ratio, pooled over the sizes of each (world size, op, form)."""
    out: dict[tuple[int, str, str], list[float]] = {}
    for r in rows:
        out.setdefault((r["world_size"], r["op"], r["form"]), []).extend(r["ratios"])
    return out


def median_interval(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval of the median (binomial order statistics:
    ranks n/2 -+ 1.96 sqrt(n)/2 of the sorted values)."""
    xs = sorted(values)
    n = len(xs)
    half = 1.96 * math.sqrt(n) / 2
    return xs[max(0, math.floor(n / 2 - half))], xs[min(n - 1, math.ceil(n / 2 + half) - 1)]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``collective-bench --busbw``."""
    ap = argparse.ArgumentParser(prog="collective-bench --busbw",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="cases/perf.yaml")
    ap.add_argument("--backend", default="gloo",
                    help="backend of the pools (its default device: cuda for nccl)")
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--min-bytes", type=int_in(0, 1 << 62), default=1 << 20)
    ap.add_argument("--max-bytes", type=int_in(0, 1 << 62), default=1 << 62)
    ap.add_argument("--ops", default="", help="comma-separated op or case-prefix names")
    ap.add_argument("--runs", type=int_in(1, 1000), default=3,
                    help="runs per point; each gives --repeats harness/bare block pairs")
    ap.add_argument("--warmup", type=int_in(0, 1_000_000), default=5)
    ap.add_argument("--iters", type=int_in(1, 1_000_000_000), default=20)
    ap.add_argument("--min-time", type=float_in(0, 3600), default=0.05)
    ap.add_argument("--repeats", type=int_in(1, 1000), default=5)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    plan = PerfPlan(warmup=args.warmup, iters=args.iters, min_time_s=args.min_time,
                    repeats=args.repeats)
    sizes = {int(x) for x in args.world_sizes.split(",")}
    why = unwritable(args.json, "--json file") if args.json else ""
    if why:
        print(f"collective-bench --busbw: error: {why}", file=sys.stderr)
        return 2
    try:
        insts = points(args.cases, args.backend, sizes, args.dtype, args.min_bytes,
                       args.max_bytes, set(args.ops.split(",")) if args.ops else None)
    except (CaseFileError, CaseFileErrors) as exc:  # the case loader's message, on one line
        text = "; ".join(line.strip() for line in str(exc).splitlines())
        print(f"collective-bench --busbw: error: {printable(text, 2000)}", file=sys.stderr)
        return 2
    if not insts:
        print(f"collective-bench --busbw: no point of {args.cases} matches", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    runner = paired_runner(args.backend, plan)
    try:
        for ws in sorted(sizes):
            for inst in (i for i in insts if i.world_size == ws):
                row = compare_point(runner, inst, args.runs)
                rows.append(row)
                print(f"{row['key']}: ratio {row['ratio']:.3f} "
                      f"[IQR {row['ratio_q1']:.3f}..{row['ratio_q3']:.3f}]",
                      file=sys.stderr, flush=True)
    finally:
        runner.close()
    import torch

    lines = [f"collective-bench --busbw: {args.backend}, torch {torch.__version__}, {args.dtype}, "
             f"{args.runs} x {args.repeats} pairs of alternating calls per point, loop: "
             f"{args.warmup} warm-up, "
             f"pairs of >= {args.iters} calls and >= {args.min_time} s each side",
             "", "| world size | op | form | size (B) | harness busbw (GB/s) | bare busbw (GB/s) "
             "| harness/bare (median call; median over pairs) | IQR over pairs | range "
             "| of mean times |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['world_size']} | {r['op']} | {r['form']} | {r['bytes']} | "
                     f"{r['harness_busbw_gbs']:.4g} | {r['bare_busbw_gbs']:.4g} | "
                     f"{r['ratio']:.3f} | {r['ratio_q1']:.3f}..{r['ratio_q3']:.3f} | "
                     f"{r['ratio_min']:.3f}..{r['ratio_max']:.3f} | "
                     f"{r['ratio_of_means']:.3f} |")
    lines += ["", "| world size | op | form | pairs | harness/bare, median over the pairs of "
              "every size | 95% CI of that median |", "|---|---|---|---|---|---|"]
    for (ws, op, form), pooled in sorted(by_op(rows).items()):
        lo, hi = median_interval(pooled)
        lines.append(f"| {ws} | {op} | {form} | {len(pooled)} | "
                     f"{statistics.median(pooled):.3f} | {lo:.3f}..{hi:.3f} |")
    ratios = [r["ratio"] for r in rows]
    lines += ["", f"median of the per-point ratios over {len(rows)} points: "
              f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"]
    for ws in sorted({r["world_size"] for r in rows}):
        pooled = sorted(x for r in rows if r["world_size"] == ws for x in r["ratios"])
        lo, hi = median_interval(pooled)
        lines.append(f"world size {ws}: all {len(pooled)} block pairs pooled: median ratio "
                     f"{statistics.median(pooled):.3f}, 95% confidence interval of the median "
                     f"{lo:.3f}..{hi:.3f}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"created": datetime.datetime.now(datetime.UTC).isoformat(),
                       "torch": str(torch.__version__), "settings": vars(args),
                       "rows": rows}, fh, indent=1)
    return 0
