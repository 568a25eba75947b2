"""``returns:``/``warns:``/``call_returns:`` on op steps: what an op call must return or warn
(checks, expansion).

``call_returns`` is about the call itself, for every op: ``none`` (it returned None, as a
synchronous call must), ``work`` (a ``torch.distributed.Work``, as an async call must) or
``auto`` (whichever the instance's async flag promises).

What the value means is the op table's business (:attr:`harness.ops.base.Op.returns`): the
sender's rank for ``recv``/``irecv``, the number of Works for ``batch_isend_irecv`` and the
coalescing manager. A case gives an integer, an expression over ``rank``, ``world_size`` and
params, or a per-rank map of those (``{1: 0, others: unspecified}``).
"""

from __future__ import annotations

import re
from typing import Any

from .. import ops
from ..errors import CaseFileError, ExprError
from ..expr import Expr, parse
from ..model import Case
from .fields import expr_names

Path = tuple[Any, ...]
UNSPECIFIED = "unspecified"


def _leaf_errors(case: Case, path: Path, value: Any) -> list[CaseFileError]:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return [case.error(path, f"a return value is an integer or an expression, got "
                           f"{value!r}")]
    if isinstance(value, str) and value != UNSPECIFIED:
        try:
            parse(value, expr_names(case))
        except ExprError as exc:
            return [case.error(path, f"bad expression {value!r}: {exc}")]
    return []


def call_returns(stated: str | None, async_op: bool) -> str | None:
    """``call_returns`` resolved for one instance: ``auto`` is what the async flag promises."""
    if stated == "auto":
        return "work" if async_op else "none"
    return stated


def check(case: Case, path: Path, step: dict[str, Any]) -> list[CaseFileError]:
    """Problems of a step's ``returns`` (the op must have a checkable return value)."""
    if "returns" not in step:
        return []
    value = step["returns"]
    rpath = (*path, "returns")
    if "op" not in step:
        return [case.error(rpath, "'returns' belongs to op steps")]
    op = ops.ALL_OPS.get(step["op"])
    if op is not None and not op.returns:
        takes = sorted(o.name for o in ops.ALL_OPS.values() if o.returns)
        return [case.error(rpath, f"op {op.name} returns nothing a case can check",
                           "ops with a checked return value: " + ", ".join(takes))]
    if isinstance(value, dict):
        errs: list[CaseFileError] = []
        for key, leaf in value.items():
            if key != "others" and (isinstance(key, bool) or not isinstance(key, int)):
                errs.append(case.error((*rpath, key), f"per-rank keys are ranks or 'others', "
                                       f"got {key!r}"))
            errs.extend(_leaf_errors(case, (*rpath, key), leaf))
        return errs
    return _leaf_errors(case, rpath, value)


def per_rank(case: Case, raw: Any, ws: int, path: Path) -> tuple[Any, ...]:
    """The expected return value on each rank: int, Expr, or None (not checked)."""
    names = expr_names(case)

    def leaf(v: Any) -> Any:
        if v == UNSPECIFIED:
            return None
        return parse(v, names) if isinstance(v, str) else int(v)

    if not isinstance(raw, dict):
        return tuple(leaf(raw) for _ in range(ws))
    bad = sorted(k for k in raw if k != "others" and int(k) >= ws)
    if bad:
        raise case.error(path, f"returns names rank {bad[0]} but world_size is {ws}")
    out: list[Any] = []
    for r in range(ws):
        if r in raw:
            out.append(leaf(raw[r]))
        elif "others" in raw:
            out.append(leaf(raw["others"]))
        else:
            out.append(None)
    return tuple(out)


def evaluate(value: Any, env: dict[str, Any]) -> Any:
    """A per-rank expected value resolved for a rank (``env`` has rank and world_size)."""
    return value(env) if isinstance(value, Expr) else value


def check_warns(case: Case, path: Path, step: dict[str, Any]) -> list[CaseFileError]:
    """``warns`` belongs to op steps and is a valid regex."""
    if "warns" not in step:
        return []
    if "op" not in step:
        return [case.error((*path, "warns"), "'warns' belongs to op steps")]
    try:
        re.compile(step["warns"])
    except re.error as exc:
        return [case.error((*path, "warns"), f"bad regular expression {step['warns']!r}: {exc}")]
    return []
