"""Checks on one expanded instance that belong at collection, not in the ranks.

The operator's :class:`~harness.casefile.limits.Limits` (world size, bytes per buffer and per
instance, object payload, sleeps), explicit values against the declared shape, every
expression evaluated once per rank at the first and last element (so a division by zero or a
string param fails here, with ``file:line:col``, instead of in a rank), and every peer rank of a
program step inside the world for each rank that runs the step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from .. import dtypes
from ..errors import CaseFileError, ExprError, quote
from ..expr import Expr
from ..model import Case, Fill, Instance, Step, TensorSpec
from . import coverage, sparse
from .limits import Limits

Path = tuple[Any, ...]


def check_instance(case: Case, inst: Instance, limits: Limits) -> None:
    """Raise :class:`CaseFileError` if ``inst`` breaks a limit or would fail in the ranks."""
    ws = inst.world_size
    if ws > limits.world_size:
        raise case.error(("world_size",), f"world_size {ws} is above this session's limit of "
                         f"{limits.world_size}", "raise it with --max-world-size / ini "
                         "collective_max_world_size")
    env: dict[str, Any] = {"world_size": ws, **dict(inst.params)}
    shapes = {t.name: t for t in inst.tensors}
    total = 0
    for spec in inst.tensors:
        path = _tensor_path(case, spec.name, inst)
        for rank in range(ws):
            shape = _int_shape(spec.shape_for(rank))
            nbytes = _bytes(case, spec, spec.init.for_rank(rank), shape, limits, path)
            total += nbytes + _around(spec)
            fill = spec.init.for_rank(rank)
            if spec.dtype != "object":
                _check_fill(case, fill, shape, {**env, "rank": rank}, path)
    if total > limits.instance_bytes:
        where = _tensor_path(case, inst.tensors[0].name, inst) if inst.tensors else ("name",)
        raise case.error(where,
                         f"the buffers of one instance ({inst.id}) take {total} bytes over all "
                         f"ranks; the limit is {limits.instance_bytes}",
                         "make them smaller, or raise --max-instance-bytes / ini "
                         "collective_max_instance_bytes")
    _check_extra_runs(case, inst, limits)
    for tname, fill in inst.expected:
        target = shapes.get(tname)
        if target is None or target.dtype == "object":
            continue
        path = ("expected",) if "op" in case.raw else ("expected", tname)
        for rank in range(ws):
            f = fill.for_rank(rank)
            if f.kind == "expr":
                _probe(case, f.data, _int_shape(target.shape_for(rank)),
                       {**env, "rank": rank}, path)
    # A case that declares a failure mode may name a rank outside the world on purpose (to
    # document how a backend rejects it); any other such step would only hang until the deadline.
    misuse = coverage.declares_failure(case.raw)
    sleep = [0.0] * ws
    # A capture's own steps are checked at the capture's index (their errors point at it).
    for idx, step in ((i, s) for i, top in enumerate(inst.steps) for s in (top, *top.steps)):
        runs = _ranks_running(case, step, ws, env, idx)
        if step.kind == "op" and not misuse:
            _check_peers(case, step, runs, ws, env, idx)
        seconds = _seconds(step)
        for r in runs:
            sleep[r] += seconds
    worst = max(sleep, default=0.0)
    if worst > limits.sleep:
        raise case.error(("steps",), f"one rank sleeps or delays {worst:g} s in {inst.id}; "
                         f"the limit is {limits.sleep:g} s",
                         "shorten the sleeps, or raise --max-sleep / ini collective_max_sleep")


def _runs(inst: Instance) -> int:
    """How many times the ranks run the program: the first run and a property's extra runs
    (harness.program.reruns)."""
    plan = inst.numerics
    if plan is None:
        return 1
    return (plan.deterministic + plan.iterations - 1 + int(plan.offset_invariant)
            + int(plan.fusion_invariant) + int(plan.size > 0))


def _check_extra_runs(case: Case, inst: Instance, limits: Limits) -> None:
    """The work of every run is bounded: the calls a rank issues over all runs, and the
    buffers of size_invariant's extra run (every buffer resized to its element count)."""
    captured = sum(s.repeat for top in inst.steps for s in top.steps if s.kind == "op")
    replays = sum(int(s.value or 1) for s in inst.steps if s.kind == "replay")
    per_run = (sum(s.repeat for s in inst.steps if s.kind == "op")
               + captured * (1 + replays))  # a replay issues the captured calls again
    calls = per_run * _runs(inst)
    if calls > limits.calls:
        key = next((k for k in ("deterministic", "iterations", "steps", "name")
                    if k in case.raw), "name")
        raise case.error((key,), f"one rank of {inst.id} would issue {calls} collective "
                         f"calls over {_runs(inst)} run(s); the limit is {limits.calls}",
                         "lower repeat, deterministic or iterations, or raise --max-calls / "
                         "ini collective_max_calls")
    size = inst.numerics.size if inst.numerics is not None else 0
    if not size:
        return
    total = 0
    for spec in inst.tensors:
        nbytes = size * max(1, dtypes.info(spec.dtype).bits // 8) if spec.dtype != "object" else 0
        if nbytes > limits.buffer_bytes:
            raise case.error(("size_invariant",), f"size_invariant: {size} elements make "
                             f"buffer {spec.name!r} ({spec.dtype}) {nbytes} bytes per rank in "
                             f"the extra run; the limit is {limits.buffer_bytes}",
                             "use a smaller size, or raise --max-buffer-bytes / ini "
                             "collective_max_buffer_bytes")
        total += nbytes * inst.world_size
    if total > limits.instance_bytes:
        raise case.error(("size_invariant",), f"size_invariant: the extra run's buffers take "
                         f"{total} bytes over all ranks; the limit is {limits.instance_bytes}",
                         "use a smaller size, or raise --max-instance-bytes / ini "
                         "collective_max_instance_bytes")


def _tensor_path(case: Case, name: str, inst: Instance) -> Path:
    if "op" in case.raw:  # the shorthand's input buffer is named by role ("tensor", "input")
        return ("input",) if inst.shorthand and name == inst.shorthand[0] else ("shape",)
    return ("tensors", name)


def _int_shape(shape: Any) -> tuple[int, ...] | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _around(spec: TensorSpec) -> int:
    """Bytes a tensor buffer's allocation holds besides its data: both guard regions and an
    offset's gap (harness.program.guards); they count toward the instance's byte limit."""
    if spec.dtype == "object" or spec.sparse is not None:
        return 0
    return 2 * spec.guard_bytes() + spec.offset * max(1, dtypes.info(spec.dtype).bits // 8)


def _bytes(case: Case, spec: TensorSpec, fill: Fill, shape: tuple[int, ...] | None,
           limits: Limits, path: Path) -> int:
    if spec.dtype == "object":
        if fill.kind != "generator":
            return 0
        size = dict(fill.data[1]).get("size", 0)
        if isinstance(size, int) and size > limits.object_bytes:
            raise case.error(path, f"objects of {size} bytes are above this session's limit "
                             f"of {limits.object_bytes}", "raise it with --max-object-bytes / "
                             "ini collective_max_object_bytes")
        count = shape[0] if shape else 1
        return int(count) * (size if isinstance(size, int) else 0)
    if shape is None:
        return 0  # taken from explicit values, which the node limit already bounds
    itemsize = max(1, dtypes.info(spec.dtype).bits // 8)
    nbytes = math.prod(shape) * itemsize
    layout, takes = "", "takes"
    if spec.sparse is not None:  # indices and duplicates on top of the dense values
        nbytes = sparse.bytes_bound(shape, itemsize, spec.sparse)
        layout, takes = ", sparse_coo: dense fill and indices", "takes up to"
    if nbytes > limits.buffer_bytes:
        raise case.error(path, f"buffer {spec.name!r} of shape {quote(list(shape), 80)} "
                         f"({spec.dtype}{layout}) {takes} {nbytes} bytes per rank; the limit is "
                         f"{limits.buffer_bytes}", "make it smaller, or raise "
                         "--max-buffer-bytes / ini collective_max_buffer_bytes")
    return int(nbytes)


def _list_dims(value: Any, path: Path, case: Case) -> tuple[int, ...]:
    """Dimensions of a rectangular nested list of numbers (error if ragged or not numbers)."""
    if not isinstance(value, list):
        if isinstance(value, bool | int | float):
            return ()
        raise case.error(path, f"{quote(value, 60)} is not a number",
                         "tensor values are numbers (or one expression for all elements)")
    if not value:
        return (0,)
    inner = {_list_dims(v, path, case) for v in value}
    if len(inner) != 1:
        raise case.error(path, "nested lists of different lengths",
                         "every row of a tensor has the same length")
    return (len(value), *inner.pop())


def _check_fill(case: Case, fill: Fill, shape: tuple[int, ...] | None, env: dict[str, Any],
                path: Path) -> None:
    if fill.kind == "list" and isinstance(fill.data, list):
        dims = _list_dims(fill.data, path, case)
        if shape is None:
            return
        if len(dims) > 1 and dims != shape:
            raise case.error(path, f"rank {env['rank']}'s values have shape {list(dims)}, but "
                             f"the buffer's shape is {list(shape)}",
                             "give the values as a flat list or nested to match 'shape'")
        if math.prod(dims) != math.prod(shape):
            raise case.error(path, f"rank {env['rank']} gives {math.prod(dims)} values for a "
                             f"buffer of shape {list(shape)} ({math.prod(shape)} elements)",
                             "give one value per element, or fix 'shape'")
    elif fill.kind == "expr":
        _probe(case, fill.data, shape, env, path)


def _probe(case: Case, expr: Expr, shape: tuple[int, ...] | None, env: dict[str, Any],
           path: Path) -> None:
    """Evaluate an element expression at the first and last element of this rank's buffer."""
    n = math.prod(shape) if shape is not None else 1
    # j/k as the ranks compute them for a plain tensor: the row along dim 0, the index in it.
    row = math.prod(shape[1:]) if shape else 1
    for i in sorted({0, max(n - 1, 0)}):
        try:
            value = expr({**env, "i": i, "j": i // row if row else i,
                          "k": i % row if row else i})
        except ExprError as exc:
            raise case.error(path, f"expression {quote(expr.source)} fails on rank "
                             f"{env['rank']} at i={i}: {exc}") from None
        if not isinstance(value, bool | int | float):
            raise case.error(path, f"expression {quote(expr.source)} gives "
                             f"{quote(value, 60)}, not a number")


def _eval_int(case: Case, value: Any, env: dict[str, Any], path: Path) -> Any:
    if not isinstance(value, Expr):
        return value
    try:
        return value(env)
    except ExprError as exc:
        raise case.error(path, f"expression {quote(value.source)} fails on rank "
                         f"{env.get('rank')}: {exc}") from None


def _ranks_running(case: Case, step: Step, ws: int, env: dict[str, Any], idx: int
                   ) -> list[int]:
    if step.ranks is None:
        return list(range(ws))
    if isinstance(step.ranks, Expr):
        return [r for r in range(ws) if _eval_int(case, step.ranks, {**env, "rank": r},
                                                  ("steps", idx, "ranks"))]
    return [r for r in step.ranks if 0 <= r < ws]


def _peer_args(step: Step) -> Iterator[tuple[str, Any]]:
    for key, value in step.args:
        if key in ("src", "dst") or key.endswith(".peer"):
            yield key, value


def _check_peers(case: Case, step: Step, runs: list[int], ws: int, env: dict[str, Any],
                 idx: int) -> None:
    for key, value in _peer_args(step):
        parts = key.split(".")
        path: Path = ("steps", idx, "p2p", int(parts[1]), "peer") if len(parts) == 3 else (
            "steps", idx, key)
        # A repeated step sees its repetition index ``rep``: check the first and the last.
        reps = sorted({0, max(step.repeat - 1, 0)})
        for r in runs:
            for rep in reps:
                peer = _eval_int(case, value, {**env, "rank": r, "rep": rep}, path)
                if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < ws:
                    raise case.error(path, f"{parts[-1]} is {quote(peer, 60)} on rank {r}, "
                                     f"outside world_size {ws}", f"ranks run 0..{ws - 1}")
    for key, value in step.args:
        if key == "group" and isinstance(value, tuple):
            bad = [g for g in value if not isinstance(g, int) or not 0 <= g < ws]
            if bad:
                raise case.error(("steps", idx, "group"), f"group rank {quote(bad[0], 60)} is "
                                 f"outside world_size {ws}", f"ranks run 0..{ws - 1}")


def _seconds(step: Step) -> float:
    if step.kind in ("sleep", "delay_stream") and isinstance(step.value, int | float):
        return float(step.value)
    return sum(float(v) for k, v in step.args if k == "delay" and isinstance(v, int | float))


__all__ = ["CaseFileError", "check_instance"]
