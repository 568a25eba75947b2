"""The ordering steps: validation and expansion into :class:`Step`.

Steps a program may use to make the async contract visible (docs/howto/async-ordering.md):

- ``{delay_stream: S}``: slow work on the rank's current stream (a CUDA sleep kernel; on CPU,
  where the host is the stream, a host sleep);
- ``{write: T, value: FILL, delay: S}``: a slow producer: after S seconds of stream work (or
  host sleep on CPU) tensor T is overwritten with FILL, on the current stream;
- ``{read: T, as: NAME, expect: EXP}``: snapshot T now (a copy on the current stream, no host
  synchronize), compared at the end with EXP: ``stale`` (T's contents at program start),
  ``final`` (T's contents at program end), ``unspecified``, or a fill;
- ``{future: H, tensor: T, as: NAME, expect: EXP}``: wait for ``get_future().then(cb)`` of
  handle H, where ``cb`` snapshots T (with ``result: true``: the future's value, its one
  tensor, which must hold T's result; ``result: N``: entry N of the value's list);
  ``{future: H, then: [{mul: 3}, {add: 1}], expect: EXP}`` chains callbacks from a fixed
  vocabulary (each maps every tensor of the value) and compares the first tensor of the
  chain's value with EXP; ``held: true`` asks for the future now and waits for it only at the
  program's end (after every Work), so that several futures are in flight at once;
- ``{wait_tensor: T}``: ``torch.ops.c10d_functional.wait_tensor(T)``, which waits for the Work
  an op with ``register_work: true`` registered under T (and does nothing for others).

Two keys of other kinds serve the same purpose: ``{wait: H, thread: true}`` calls ``wait()``
from another thread (:mod:`~harness.casefile.stepkinds.wait`), and ``{op: ..., stream: side}``
issues the op on a side CUDA stream that first waits for the current one (cases using it must
say ``device: cuda``; checked with the keys every step shares).
"""

from __future__ import annotations

from typing import Any

from ...errors import CaseFileError, CaseFileErrors, quote
from ...expr import Expr
from ...model import Case, Fill, Step
from ..fields import KEYWORDS, check_expr, check_fill, parse_fill, suggest
from .base import BuildContext, CheckContext, Path, RawStep, StepKind

SNAPSHOT_KEYWORDS = ("stale", "final", "unspecified")


def _check_expect(case: Case, path: tuple[Any, ...], value: Any,
                  errs: list[CaseFileError]) -> None:
    if isinstance(value, dict) and "generator" not in value:
        for k, v in value.items():
            _check_expect(case, (*path, k), v, errs)
        return
    if isinstance(value, str):
        if value in SNAPSHOT_KEYWORDS:
            return
        if value in KEYWORDS:
            errs.append(case.error(path, f"{value!r} cannot be used in a snapshot expectation",
                                   "allowed: stale, final, unspecified, a list, an expression"))
            return
        try:
            check_expr(case, path, value, ("i", "j", "k"))
        except CaseFileErrors as exc:
            errs.extend(exc.errors)


def _tensor(case: Case, path: tuple[Any, ...], key: str, name: Any,
            tensors: dict[str, Any], errs: list[CaseFileError]) -> None:
    if not isinstance(name, str):  # the schema allows lists for op steps' repeat
        errs.append(case.error((*path, key), f"'{key}' names one tensor; got "
                               f"{quote(name, 60)}", "give one tensor name"))
    elif name not in tensors:
        errs.append(case.error((*path, key), f"unknown tensor {name!r}",
                               suggest(str(name), tuple(tensors)) if tensors else
                               "declare it under 'tensors:'"))


def _check_then(case: Case, path: tuple[Any, ...], step: dict[str, Any]
                ) -> list[CaseFileError]:
    """A chained future states the chain's value: no tensor, an expectation that is a fill."""
    errs: list[CaseFileError] = []
    if "tensor" in step:
        errs.append(case.error((*path, "tensor"), "a future step with 'then' checks the "
                               "value the chain returns, not a tensor", "drop 'tensor'"))
    if "expect" not in step:
        errs.append(case.error(path, "a future step with 'then' needs 'expect: FILL' (the "
                               "chain's value)", "e.g. expect: \"2 * world_size * 3 + 1\""))
    for key in _snapshot_keywords(step.get("expect")):
        errs.append(case.error((*path, "expect"), f"{key!r} refers to a tensor; the chain's "
                               "value has none", "give a list, a number or an expression"))
    return errs


def _snapshot_keywords(value: Any) -> list[str]:
    if isinstance(value, dict) and "generator" not in value:
        return [k for v in value.values() for k in _snapshot_keywords(v)]
    return [value] if value in ("stale", "final") else []


def parse_expect(case: Case, raw: Any) -> Fill | None:
    """A snapshot expectation as a :class:`Fill` (``stale``/``final`` are keyword kinds)."""
    if raw is None:
        return None
    if isinstance(raw, str) and raw in SNAPSHOT_KEYWORDS:
        return Fill(raw)  # type: ignore[arg-type]
    if isinstance(raw, dict) and "generator" not in raw:
        return Fill("per_rank", {k: parse_expect(case, v) for k, v in raw.items()})
    return parse_fill(case, raw)


def _running_ranks(ranks: tuple[int, ...] | Expr | None, env: dict[str, Any]) -> list[int]:
    ws = int(env["world_size"])
    if ranks is None:
        return list(range(ws))
    if isinstance(ranks, Expr):
        return [r for r in range(ws) if ranks({**env, "rank": r})]
    return list(ranks)


def _cover(case: Case, path: tuple[Any, ...], fill: Fill | None, needed: list[int]) -> None:
    if fill is None or fill.kind != "per_rank":
        return
    missing = [r for r in needed if r not in fill.data and "others" not in fill.data]
    if missing:
        raise case.error(path, f"no value for rank(s) {', '.join(map(str, missing))}, which run "
                         "this step", "add them, or an 'others:' entry")


class OrderingStep(StepKind):
    """``delay_stream``, ``write``, ``read``, ``future`` and ``wait_tensor``; their problems
    come right after the check of which keys apply, before the outcome keys'."""

    actions = ("delay_stream", "write", "read", "future", "wait_tensor")
    check_after = "keys"

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """The tensors and handles the step names, a write's value, a snapshot's expectation
        and a future's callbacks."""
        case, tensors = ctx.case, ctx.tensors
        errs: list[CaseFileError] = []
        if action == "write":
            _tensor(case, path, "write", step["write"], tensors, errs)
            if "value" not in step:
                errs.append(case.error(path, "a write step needs 'value: FILL'",
                                       "e.g. {write: t, value: \"rank + i\", delay: 0.05}"))
            else:
                try:
                    check_fill(case, (*path, "value"), step["value"], False)
                except CaseFileErrors as exc:
                    errs.extend(exc.errors)
        elif action in ("read", "wait_tensor"):
            _tensor(case, path, action, step[action], tensors, errs)
        elif action == "future":
            if step["future"] not in ctx.handles:
                errs.append(case.error((*path, "future"), f"no earlier step has handle "
                                       f"{step['future']!r}", "give the async op 'handle: NAME'"))
            if "then" in step:
                errs.extend(_check_then(case, path, step))
                if step.get("held"):
                    errs.append(case.error((*path, "held"), "a held future cannot chain "
                                           "callbacks", "drop 'held' or 'then'"))
            elif "tensor" in step:
                _tensor(case, path, "tensor", step["tensor"], tensors, errs)
            elif "expect" in step or "result" in step:
                key = "expect" if "expect" in step else "result"
                errs.append(case.error(path, f"'{key}' on a future step needs 'tensor: NAME'",
                                       "name the tensor the callback reads (or whose result "
                                       "the future's value holds)"))
        if "expect" in step and action in ("read", "future"):
            _check_expect(case, (*path, "expect"), step["expect"], errs)
        return errs

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The ordering step; a write's value and a snapshot's expectation must cover every
        rank that runs it."""
        return make_step(ctx.case, step, ctx.path[1], ctx.line, ctx.ranks, ctx.env)


def make_step(case: Case, raw: dict[str, Any], idx: int, line: int,
              ranks: tuple[int, ...] | Expr | None, env: dict[str, Any]) -> Step:
    """The :class:`Step` for one ordering step of a program (already validated)."""
    path = ("steps", idx)
    needed = _running_ranks(ranks, env)
    if "delay_stream" in raw:
        return Step("delay_stream", line, ranks=ranks, value=float(raw["delay_stream"]))
    if "wait_tensor" in raw:
        return Step("wait_tensor", line, ranks=ranks, bufs=(("tensor", raw["wait_tensor"]),))
    if "write" in raw:
        fill = parse_fill(case, raw["value"])
        _cover(case, (*path, "value"), fill, needed)
        return Step("write", line, ranks=ranks, bufs=(("tensor", raw["write"]),), value=fill,
                    args=(("delay", float(raw.get("delay", 0.0))),))
    expect = parse_expect(case, raw.get("expect"))
    _cover(case, (*path, "expect"), expect, needed)
    if "read" in raw:
        return Step("read", line, ranks=ranks, bufs=(("tensor", raw["read"]),),
                    handle=raw.get("as") or f"{raw['read']}@step{idx}", value=expect)
    handle = raw["future"]
    bufs = (("tensor", raw["tensor"]),) if "tensor" in raw else ()
    # ``then``: callbacks chained on the future, as (name, number) pairs of a fixed vocabulary.
    then = tuple(next(iter(t.items())) for t in raw.get("then", ()))
    return Step("future", line, ranks=ranks, waits=(handle,), bufs=bufs,
                handle=raw.get("as") or f"{handle}.future@step{idx}", value=expect,
                args=((("then", then),) if then else ()) + ((("result", raw["result"]),)
                      if raw.get("result") is not None and raw.get("result") is not False
                      else ()) + ((("held", True),) if raw.get("held") else ()))


KIND = OrderingStep()
