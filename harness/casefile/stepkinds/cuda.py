"""The CUDA-only steps: validation and expansion into :class:`Step`.

- ``{capture: G, steps: [...]}``: record the listed op and wait steps into the CUDA graph
  ``G`` (``torch.cuda.graph``); nothing runs while capturing. Capturing ``G`` again replaces
  the graph (upstream re-captures in a loop);
- ``{replay: G, times: N}``: replay the graph ``G`` N times (default 1) on the current stream;
- ``{wait_stream: side}``: the current stream waits for the side stream (the ops a program
  issued with ``stream: side``), as ``torch.cuda.current_stream().wait_stream(side)``;
- ``{block_current_stream: H}``: ``work.block_current_stream()`` of the async op with handle
  ``H``; the handle stays open (a later ``wait`` or the end of the program waits it).

They need CUDA tensors (``device: cuda``); instances skip where there is no GPU (decided in
the parent by :mod:`harness.run.capabilities`, with the reason). Inside a capture only ``op``
and ``wait`` steps are allowed, and a handle issued there must be waited there: a captured
Work cannot be waited once the capture has ended.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...errors import CaseFileError
from ...model import Case, Step
from ..fields import as_list
from .base import BuildContext, CheckContext, RawStep, StepKind

CUDA_STEPS = ("capture", "replay", "wait_stream", "block_current_stream")
# Keys a step inside a capture may not use: they observe or steer the host while the stream
# is only being recorded (is_completed() and event queries are illegal during a capture).
NOT_IN_CAPTURE = ("stream", "thread", "timeout", "returns", "warns")


def walk(steps: list[Any]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, raw step) for every step of a program, a capture's own steps right after it."""
    for idx, step in enumerate(steps):
        yield ("steps", idx), step
        if isinstance(step, dict) and isinstance(step.get("capture"), str):
            for j, inner in enumerate(step.get("steps") or []):
                yield ("steps", idx, "steps", j), inner


def devices(case: Case) -> list[str]:
    """The case's ``device:`` values (CUDA steps and ``stream: side`` need ``[cuda]``)."""
    dev = case.raw.get("device", "default")
    return dev if isinstance(dev, list) else [dev]


def check_program(case: Case, actions: tuple[str, ...]) -> list[CaseFileError]:
    """Problems of a program's CUDA steps that per-step checks cannot see (``actions``: the
    step kinds of the format, for what a capture may not record)."""
    errs: list[CaseFileError] = []
    steps = case.raw.get("steps", [])
    graphs: set[str] = set()
    handles: set[str] = set()
    captured: dict[str, str] = {}  # handle issued inside a capture -> the graph
    for idx, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        path: tuple[Any, ...] = ("steps", idx)
        kind = next((k for k in CUDA_STEPS if k in step), None)
        if kind is not None and devices(case) != ["cuda"]:
            errs.append(case.error((*path, kind), f"'{kind}' needs CUDA tensors",
                                   "add 'device: cuda' to the case (it skips without a GPU)"))
        if kind == "capture":
            errs.extend(_check_capture(case, path, step, captured, actions))
            graphs.add(step["capture"])
        elif kind == "replay" and step["replay"] not in graphs:
            errs.append(case.error((*path, "replay"), f"no earlier step captures graph "
                                   f"{step['replay']!r}", "capture it first: "
                                   "{capture: NAME, steps: [...]}"))
        elif kind == "block_current_stream":
            h = step["block_current_stream"]
            if h in captured:
                errs.append(case.error((*path, kind), f"handle {h!r} belongs to capture "
                                       f"{captured[h]!r}", "block on a handle issued outside "
                                       "a capture"))
            elif h not in handles:
                errs.append(case.error((*path, kind), f"no earlier step has handle {h!r}",
                                       "give the async op 'handle: NAME' first"))
        elif "wait" in step:
            for h in as_list(step["wait"]):
                if h in captured:
                    errs.append(case.error((*path, "wait"), f"handle {h!r} was issued inside "
                                           f"capture {captured[h]!r}",
                                           "wait it inside the capture, after its op"))
        if "handle" in step:
            handles.add(step["handle"])
    return errs


def _check_capture(case: Case, path: tuple[Any, ...], step: dict[str, Any],
                   captured: dict[str, str], actions: tuple[str, ...]) -> list[CaseFileError]:
    errs: list[CaseFileError] = []
    if "steps" not in step:
        return [case.error(path, "a capture step needs 'steps: [...]' (the ops to record)",
                           "e.g. {capture: g, steps: [{op: all_reduce, tensor: t}]}")]
    graph = step["capture"]
    open_handles: dict[str, tuple[Any, ...]] = {}
    for j, inner in enumerate(step["steps"]):
        ipath = (*path, "steps", j)
        if not isinstance(inner, dict):
            continue
        bad = [k for k in actions if k in inner and k not in ("op", "wait")]
        if bad:
            errs.append(case.error((*ipath, bad[0]), f"a capture records op and wait steps "
                                   f"only, not {bad[0]!r}", "move it before or after the "
                                   "capture"))
            continue
        for key in NOT_IN_CAPTURE:
            if key in inner:
                errs.append(case.error((*ipath, key), f"'{key}' cannot be used inside a "
                                       "capture (nothing runs while a graph is recorded)",
                                       "move the step out of the capture"))
        if "op" in inner and "handle" in inner:
            open_handles[inner["handle"]] = ipath
            captured[inner["handle"]] = graph
        for h in as_list(inner.get("wait", [])):
            if h not in open_handles:
                errs.append(case.error((*ipath, "wait"), f"no earlier step of capture "
                                       f"{graph!r} has handle {h!r}",
                                       "a capture waits only the works it issued"))
            open_handles.pop(h, None)
    for h, hpath in open_handles.items():
        errs.append(case.error((*hpath, "handle"), f"handle {h!r} is never waited inside "
                               f"capture {graph!r}", "add {wait: " + h + "} to the capture's "
                               "steps (a captured work cannot be waited after the capture)"))
    return errs


class CudaStep(StepKind):
    """``capture``, ``replay``, ``wait_stream`` and ``block_current_stream``: their rules span
    the program (a graph captured before it is replayed, a handle waited inside its capture),
    so they are checked once per program."""

    actions = CUDA_STEPS

    def check_program(self, ctx: CheckContext) -> list[CaseFileError]:
        """See :func:`check_program`."""
        return check_program(ctx.case, ctx.actions)

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The CUDA step; a capture's own steps are built through the registry."""
        if action == "capture":
            inner = tuple(ctx.inner(x, (*ctx.path, "steps", j))
                          for j, x in enumerate(step.get("steps", ())))
            return Step("capture", ctx.line, ranks=ctx.ranks, handle=step["capture"],
                        steps=inner)
        if action == "replay":
            return Step("replay", ctx.line, ranks=ctx.ranks, waits=(step["replay"],),
                        value=int(step.get("times", 1)))
        if action == "block_current_stream":
            return Step("block_current_stream", ctx.line, ranks=ctx.ranks,
                        waits=(step["block_current_stream"],))
        return Step("wait_stream", ctx.line, ranks=ctx.ranks, value=step["wait_stream"])


KIND = CudaStep()
