"""Per-step checks and argument helpers of the interpreter: ``returns:``, ``warns:``,
and ``work_state`` (see :mod:`harness.casefile.stepkinds.work_state`; its Work keys of the
backend contract suites are read in :mod:`harness.program.contract`), group-local
addressing and the PREMUL_SUM tensor factor.

Runs inside rank processes (imports torch).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..expr import Expr
from ..model import Instance, Step, TensorCheck
from . import contract


def check_return(idx: int, step: Step, rank: int, world_size: int, env: dict[str, Any],
                 returned: dict[str, Any]) -> TensorCheck:
    """Compare what the op of step ``idx`` returned on this rank with ``returns:``."""
    assert step.returns is not None and step.op is not None
    want = returns_value(step.returns[rank], {**env, "rank": rank, "world_size": world_size})
    what = f"return of step {idx} ({step.op})"
    if "value" not in returned and "source_of" in returned:  # an irecv, waited by now
        returned["value"] = returned["source_of"]._source_rank()
    if "value" not in returned:
        return TensorCheck(tensor=what, ok=False, expectation="explicit", wrong=1, total=1,
                           note="the op returned no value (was its Work waited?)")
    got = returned["value"]
    ok = got == want and type(got) is type(want)
    return TensorCheck(tensor=what, ok=ok, expectation="explicit", wrong=0 if ok else 1,
                       total=1, first_wrong=[] if ok else [(0, repr(want), repr(got))])


def check_warns(idx: int, step: Step, returned: dict[str, Any]) -> TensorCheck:
    """Whether a warning of step ``idx``'s call matched ``warns:`` (``Type: message``)."""
    assert step.warns is not None
    seen: list[str] = returned.get("warnings", [])
    ok = any(re.search(step.warns, w) for w in seen)
    got = "; ".join(w[:200] for w in seen[:3]) or "no warning"
    return TensorCheck(tensor=f"warning of step {idx} ({step.op})", ok=ok,
                       expectation="explicit", wrong=0 if ok else 1, total=1,
                       first_wrong=[] if ok else [(0, repr(step.warns), got)])


def check_work_state(idx: int, step: Step, work: Any,
                     env: dict[str, Any] | None = None) -> TensorCheck:
    """What ``is_completed()``, ``is_success()`` and ``exception()`` of the Work of step
    ``idx``'s handle return now, against the stated values (one element per stated key;
    a method the Work lacks, or that raises, counts as wrong with what happened)."""
    handle = step.waits[0]
    stated = list(step.args)
    check = TensorCheck(tensor=f"work_state of step {idx} ({handle})", ok=True,
                        expectation="explicit", total=len(stated))
    for pos, (key, want) in enumerate(stated):
        if work is None:
            got = f"no Work named {handle!r} on this rank"
            ok = False
        else:
            got, ok = _work_key(work, key, want, env or {})
        if not ok:
            check.first_wrong.append((pos, f"{key}: {want!r}", got))
    check.wrong = len(check.first_wrong)
    check.ok = check.wrong == 0
    return check


def _work_key(work: Any, key: str, want: Any, env: dict[str, Any]) -> tuple[str, bool]:
    if key in contract.WORK_KEYS:
        return contract.work_value(work, key, want, env)
    try:
        value = getattr(work, key)()
    except Exception as exc:  # e.g. a torch that dropped the deprecated method
        return f"{key}() raised {type(exc).__name__}: {str(exc)[:150]}", False
    return _state_matches(key, want, value)


def _state_matches(key: str, want: Any, value: Any) -> tuple[str, bool]:
    if key != "exception":
        return repr(value), isinstance(value, bool) and value is want
    if value is None:
        return "None", want == "none"
    text = f"{type(value).__name__}: {value}"
    return text[:200], want != "none" and re.search(str(want), text) is not None


def returns_value(value: Any, env: dict[str, Any]) -> Any:
    """An expected return value resolved for this rank (an int, or an Expr evaluated)."""
    return int(value(env)) if isinstance(value, Expr) else value


def factor_like(inst: Instance, passed: dict[str, Any]) -> torch.Tensor | None:
    """With ``premul_tensor``, a tensor of the op's buffers (for the factor's dtype/device)."""
    if not inst.premul_tensor:
        return None
    for value in passed.values():
        first = value[0] if isinstance(value, list) and value else value
        if isinstance(first, torch.Tensor):
            return first
    return None


def group_addressing(args: dict[str, Any], group_ranks: tuple[int, ...]) -> None:
    """For ``group_src``/``group_dst`` (positions in the group): add the global rank the
    harness uses itself (root-only buffers, the reference); torch still gets the group form.
    An out-of-range position maps to None so that torch, not the harness, reports it."""
    for key in ("src", "dst"):
        if f"group_{key}" in args:
            pos = int(args[f"group_{key}"])
            args[key] = group_ranks[pos] if 0 <= pos < len(group_ranks) else None
            args["addressing"] = "group"
