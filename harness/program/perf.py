"""Rank-side timing of an instance (``--perf``): nccl-tests' loop on the checked buffers.

Called by :func:`harness.program.interpreter.run_instance` right after the correctness check,
with the very buffers that were checked. It only measures: the parent takes the maximum over
ranks, the median over repeats, and computes bandwidths (:mod:`harness.perf.stats`).

The loop, as nccl-tests runs it: ``warmup`` iterations; then ``repeats`` timed blocks, each
started after a small all_reduce that lines the ranks up, and stopped after the last iteration
has completed (``wait()`` on every Work, and a device synchronize for CUDA tensors, since on
CUDA a finished ``wait()`` only means the work is queued on the stream). Every rank must issue
the same collectives, so the iteration count is agreed (the maximum of each rank's estimate)
before the first timed block; so is the decision to time at all: when any rank's check
failed, no rank times and the instance gets no bandwidth.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .. import ops
from ..model import Instance, PerfPlan, Step
from .interpreter import RankEnv, bind_op, in_ranks, step_args

Iteration = Callable[[], None]


def _device(renv: RankEnv) -> torch.device:
    if renv.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(renv: RankEnv) -> None:
    if renv.device == "cuda":
        torch.cuda.synchronize()


def _agree(value: float, renv: RankEnv, op: Any) -> float:
    """``value`` reduced with ``op`` over the instance's ranks (also lines them up): the
    default group, or the subgroup an external-ranks run placed the instance on."""
    # float32 holds every value agreed here exactly (flags, iteration counts below 2**24)
    # and every backend reduces it.
    t = torch.tensor([value], dtype=torch.float32, device=_device(renv))
    dist.all_reduce(t, op=op, group=renv.world_group)
    return float(t.item())


def _op_steps(inst: Instance, renv: RankEnv, env: dict[str, Any]) -> list[Step]:
    return [s for s in inst.steps if in_ranks(s, renv.rank, renv.world_size, env)]


def _message_bytes(inst: Instance, renv: RankEnv, env: dict[str, Any],
                   bufs: dict[str, Any]) -> int:
    """nccl-tests' "size": the largest buffer an op of this rank touches (the full buffer of
    a gather, reduce-scatter or all-to-all; the one buffer of all_reduce, broadcast, p2p)."""
    sizes = [int(bufs[t].numel() * bufs[t].element_size())
             for s in _op_steps(inst, renv, env) if s.kind == "op" for _, t in s.bufs
             if isinstance(bufs.get(t), torch.Tensor)]
    return max(sizes, default=0)


def harness_iteration(inst: Instance, renv: RankEnv, env: dict[str, Any],
                      bufs: dict[str, Any]) -> Iteration:
    """One run of the program's op and wait steps through the op table's calls, bound once
    (:func:`bind_op`: the arguments are the same on every iteration)."""
    steps = _op_steps(inst, renv, env)
    written: set[str] = set()
    bound = {i: bind_op(inst, step, renv, env, bufs, written, timing=True)
             for i, step in enumerate(steps) if step.kind == "op"}

    def run() -> None:
        handles: dict[str, Any] = {}
        for i, step in enumerate(steps):
            if step.kind == "op":
                work = bound[i]()
                if work is not None:
                    if step.handle:
                        handles[step.handle] = work
                    else:
                        work.wait()
            elif step.kind == "wait":
                for h in step.waits:
                    work = handles.pop(h, None)
                    if work is not None:
                        work.wait()
            elif step.kind == "sync":
                _sync(renv)
        for work in handles.values():
            work.wait()

    return run


def _reduce_op(name: str | None) -> Any:
    return getattr(dist.ReduceOp, (name or "sum").upper())


def bare_iteration(inst: Instance, renv: RankEnv, env: dict[str, Any],
                   bufs: dict[str, Any]) -> Iteration | str:
    """The same op as a plain ``torch.distributed`` call (:meth:`~harness.ops.Op.bare_call`,
    written apart from the op's harness call): the reference ``collective-bench --busbw``
    compares the harness with. A string says why there is none for this instance (only the
    ops of ``cases/perf.yaml`` have one)."""
    steps = [s for s in _op_steps(inst, renv, env) if s.kind == "op"]
    if not steps:
        return run_nothing
    table = [ops.get(str(s.op)) for s in steps]
    if any(s.async_op and not op.bare_posts for s, op in zip(steps, table, strict=True)):
        return "the bare loop times blocking calls only"
    b = [{role: bufs[t] for role, t in s.bufs} for s in steps]
    a = [step_args(s, renv.rank, renv.world_size, env) for s in steps]
    if any("group" in x for x in a):
        return "the bare loop runs on the default group only"
    name = steps[0].op
    red = _reduce_op(inst.reduce_op)
    if table[0].bare_posts:
        calls = [op.bare_call(dist, x, y, red, renv.rank, renv.world_size)
                 for op, x, y in zip(table, b, a, strict=True)]
        posted = [c for c in calls if c is not None]
        if len(posted) != len(calls):
            return f"no bare loop for {name} with these arguments"
        order = wait_order(_op_steps(inst, renv, env))

        def ring() -> None:
            works = [post() for post in posted]
            for i in order:
                w = works[i]
                if w is not None:
                    w.wait()

        return ring
    if len(steps) != 1:
        return f"no bare loop for a program of {len(steps)} ops"
    y = a[0]
    if y.get("form", "concat") != "concat":
        return f"no bare loop for {name} with form {y.get('form')}"
    call = table[0].bare_call(dist, b[0], y, red, renv.rank, renv.world_size)
    if call is None:
        return f"no bare loop for {name} with these arguments"
    return call


def wait_order(program: list[Step]) -> list[int]:
    """The indexes, among the op steps of ``program`` (one rank's steps), of their Works in
    the order the case waits them: the ``wait`` steps' handles in order, then the rest (the
    bare loop issues every call first, so a Work without a handle, which
    :func:`harness_iteration` waits at once, is waited last there; the p2p cases of
    ``cases/perf.yaml`` name every handle). On Gloo, waiting an irecv before its isend cost
    about 5-15 % per call at 1 MiB: a bare loop that waited in another order than the case
    measured the case's choice, not the harness."""
    op_steps = [s for s in program if s.kind == "op"]
    index = {s.handle: i for i, s in enumerate(op_steps) if s.handle}
    order: list[int] = []
    for s in program:
        if s.kind == "wait":
            order += [index[h] for h in s.waits if h in index and index[h] not in order]
    return order + [i for i in range(len(op_steps)) if i not in order]


def run_nothing() -> None:
    """The iteration of a rank with no op to run (outside every step's ``ranks``)."""


def iteration_count(plan: PerfPlan, per_iter_s: float) -> int:
    """Iterations per timed block: at least ``plan.iters``, enough for ``plan.min_time_s``."""
    want = plan.iters
    if per_iter_s > 0 and plan.min_time_s > 0:
        want = max(want, math.ceil(plan.min_time_s / per_iter_s))
    return max(1, min(want, plan.max_iters))


def time_instance(inst: Instance, renv: RankEnv, env: dict[str, Any], bufs: dict[str, Any],
                  checks_ok: bool) -> dict[str, Any]:
    """Time ``inst``'s op on ``bufs``; raw per-repeat seconds per iteration of this rank."""
    plan = inst.perf
    assert plan is not None
    if _agree(1.0 if checks_ok else 0.0, renv, dist.ReduceOp.MIN) < 1.0:
        return {"not_timed": "the correctness check failed on some rank"}
    # (A bare loop that cannot be built is agreed on below, before any rank starts timing.)
    one = harness_iteration(inst, renv, env, bufs)
    bare: Iteration | str | None = (bare_iteration(inst, renv, env, bufs) if plan.paired_bare
                                    else None)
    # Every rank must agree on whether the bare loop runs, or the ones that run it block.
    if bare is not None and _agree(0.0 if isinstance(bare, str) else 1.0, renv,
                                   dist.ReduceOp.MIN) < 1.0:
        return {"not_timed": bare if isinstance(bare, str) else "another rank has no bare loop"}
    _sync(renv)
    started = time.perf_counter()
    one()  # the first warm-up iteration, timed alone: it bounds the rest of the warm-up
    _sync(renv)
    first = _agree(time.perf_counter() - started, renv, dist.ReduceOp.MAX)
    if first * max(plan.warmup - 1, 0) > plan.budget_s:
        return {"not_timed": _over_budget(plan, first * plan.warmup, "the warm-up")}
    t0 = time.perf_counter()
    for _ in range(plan.warmup - 1):
        one()
    _sync(renv)
    warm = time.perf_counter() - t0
    per_iter = warm / (plan.warmup - 1) if plan.warmup > 1 else first
    mine = iteration_count(plan, per_iter) if plan.warmup else plan.iters
    n = int(_agree(float(mine), renv, dist.ReduceOp.MAX))
    # Every rank decides from the same (agreed) prediction, so all skip or all time.
    left = plan.budget_s - (time.perf_counter() - started)
    predicted = _agree(n * per_iter * plan.repeats * (2 if callable(bare) else 1), renv,
                       dist.ReduceOp.MAX)
    if predicted > left:
        return {"not_timed": _over_budget(plan, predicted, f"{plan.repeats} blocks of {n:,} "
                                          "iterations")}
    times: list[float] = []
    pairs: list[Pair] = []
    for r in range(plan.repeats):
        if callable(bare):
            pairs.append(timed_pair(one, bare, n, renv, bare_first=r % 2 == 1))
            times.append(pairs[-1].mean_s)
        else:
            times.append(timed_block(one, n, renv))
    out: dict[str, Any] = {"times_s": times, "iters": n, "warmup": plan.warmup,
                           "bytes": _message_bytes(inst, renv, env, bufs)}
    if pairs:
        out["bare_times_s"] = [p.bare_mean_s for p in pairs]
        out["median_call_s"] = [p.median_s for p in pairs]
        out["bare_median_call_s"] = [p.bare_median_s for p in pairs]
    return out


def _over_budget(plan: PerfPlan, predicted_s: float, what: str) -> str:
    return (f"timing budget: {what} would take about {predicted_s:.1f} s, above the "
            f"{plan.budget_s:.1f} s the timing may take (lower --perf-iters/--perf-min-time/"
            "--perf-repeats, or raise the deadline: the budget is part of it)")


@dataclass(frozen=True)
class Pair:
    """One block of alternating harness and bare calls: seconds per call, mean and median."""

    mean_s: float
    bare_mean_s: float
    median_s: float
    bare_median_s: float


def timed_pair(one: Iteration, bare: Iteration, n: int, renv: RankEnv, bare_first: bool
               ) -> Pair:
    """``n`` calls of ``one`` and ``n`` of ``bare``, alternating (one, bare, one, ...; bare
    first when ``bare_first``), each timed to its completion (a device synchronize after it
    for CUDA tensors, on both sides alike).

    Two blocks timed one after the other (as :func:`timed_block` would) see the machine's
    load change between them: on a shared 2-core machine the ratio of a pair of 50 ms blocks
    spread from 0.5 to 3.5 while its median was 1.0. Alternating call by call puts both sides
    under the same load. The medians per call are also kept: a stall of the machine inside
    one call (several ms, against 1 ms for a call at 1 MiB) moves a block's mean by tens of
    percent and its median hardly at all.
    """
    _agree(0.0, renv, dist.ReduceOp.SUM)  # line the ranks up, as nccl-tests' barrier
    _sync(renv)
    order = ((bare, 1), (one, 0)) if bare_first else ((one, 0), (bare, 1))
    spent: tuple[list[float], list[float]] = ([], [])
    clock = time.perf_counter
    for _ in range(n):
        for fn, side in order:
            t0 = clock()
            fn()
            _sync(renv)
            spent[side].append(clock() - t0)
    return Pair(sum(spent[0]) / n, sum(spent[1]) / n, statistics.median(spent[0]),
                statistics.median(spent[1]))


def timed_block(fn: Iteration, n: int, renv: RankEnv) -> float:
    """Seconds per iteration of ``n`` calls of ``fn``, the ranks lined up first."""
    _agree(0.0, renv, dist.ReduceOp.SUM)  # line the ranks up, as nccl-tests' barrier
    _sync(renv)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    _sync(renv)
    return (time.perf_counter() - t0) / n
