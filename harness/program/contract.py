"""Rank side of the API-contract checks PyTorch's backend contract suites make beyond values
(:mod:`harness.casefile.stepkinds.pgstate`, :mod:`~harness.casefile.stepkinds.device`, the
``call_returns`` key of op steps and the Work keys of ``work_state`` steps).

Each check becomes a :class:`~harness.model.TensorCheck` with one element per stated value, so
the record's evidence says what was compared; a private method the installed torch lacks is
a failed check that says so (instances normally skip before that, see
:mod:`harness.run.capabilities`).

Runs inside rank processes (imports torch).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.distributed as dist

from ..expr import Expr
from ..model import Step, TensorCheck


def _check(what: str, want: Any, got: Any, ok: bool) -> TensorCheck:
    return TensorCheck(tensor=what, ok=ok, expectation="explicit", wrong=0 if ok else 1,
                       total=1, first_wrong=[] if ok else [(0, str(want), str(got)[:200])])


def _value(value: Any, env: dict[str, Any]) -> Any:
    return int(value(env)) if isinstance(value, Expr) else value


def call_returned(where: str, step: Step, returned: Any) -> TensorCheck:
    """What the call of op step ``step`` (at ``where``: "step 3", "capture g") returned,
    against ``call_returns`` (none / work)."""
    none = step.call_returns == "none"
    ok = returned is None if none else isinstance(returned, dist.Work)
    kind = type(returned)
    got = "None" if returned is None else f"a {kind.__module__}.{kind.__name__}"
    want = "None" if step.call_returns == "none" else "a torch.distributed.Work"
    return _check(f"return of the call of {where} ({step.op})", want, got, ok)


def default_group(group: Any) -> Any:
    """The process group object of a step's group (None: the default, world group)."""
    return group if group is not None else dist.distributed_c10d._get_default_group()


def run(idx: int, step: Step, group: Any, env: dict[str, Any]) -> TensorCheck | None:
    """One ``seq_number``, ``work_registry``, ``enable_timing``, ``set_device``,
    ``current_device`` or ``stream_idle`` step on this rank; its check, if it states one.
    ``env``: the expression environment of this rank (``rank``, ``world_size``, params)."""
    what = f"{step.kind} of step {idx}"
    if step.kind == "enable_timing":
        default_group(group)._enable_collectives_timing()
        return None
    if step.kind == "set_device":
        torch.cuda.set_device(_value(step.value, env))
        return None
    want = _value(step.value, env)
    if step.kind == "seq_number":
        got = default_group(group)._get_sequence_number_for_group()
    elif step.kind == "work_registry":
        got = torch._C._distributed_c10d._get_work_registry_size()
    elif step.kind == "current_device":
        got = torch.cuda.current_device()
    else:  # stream_idle
        got = bool(torch.cuda.current_stream().query())
    return _check(what, want, got, got == want and type(got) is type(want))


WORK_KEYS = ("sequence_number", "duration", "future_result")


def work_value(work: Any, key: str, want: Any, env: dict[str, Any]) -> tuple[str, bool]:
    """(what was seen, whether it is what ``want`` states) for one of the Work keys of a
    ``work_state`` step that :mod:`harness.program.stepchecks` does not handle itself:
    ``sequence_number``, ``duration``, ``future_result``; ``want`` may be ``{raises: RE}``."""
    try:
        if key == "sequence_number":
            value: Any = work._get_sequence_number()
        elif key == "duration":
            value = work._get_duration()
        else:
            value = work.get_future_result().wait()
    except Exception as exc:  # stated (raises:) or a failed check that says what happened
        text = f"{type(exc).__name__}: {str(exc)[:150]}"
        if isinstance(want, dict):
            return text, re.search(str(want["raises"]), text) is not None
        return f"raised {text}", False
    if isinstance(want, dict):
        return f"returned {value!r} without raising", False
    if key == "sequence_number":
        return repr(value), isinstance(value, int) and value == _value(want, env)
    if key == "duration":
        ok = isinstance(value, float | int) and math.isfinite(value) and value > 0
        return repr(value), ok
    results = getattr(torch._C._distributed_c10d, "WorkResult")  # noqa: B009 (no stub)
    names = {int(v): k.lower() for k, v in results.__members__.items()}
    name = names.get(int(value), repr(value))
    return name, name == want
