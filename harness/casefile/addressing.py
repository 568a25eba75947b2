"""Group-local addressing: ``group_src``/``group_dst`` (and ``group_peer`` in a batch).

Beside the global ``src``/``dst``, torch accepts the root as a position in the group
(``group_src=1`` is the group's second member). A case may use either form, never both; the
harness passes the group form through to torch (so the installed torch's handling of it is
what is tested) and converts it to the global rank for its own bookkeeping (the reference
model, which rank holds a root-only buffer). Instances skip where the installed torch's
function has no such parameter.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..errors import CaseFileError, CaseFileErrors
from ..model import Case
from .fields import check_expr

Path = tuple[Any, ...]
GROUP_KEYS = {"src": "group_src", "dst": "group_dst"}


def allowed(op: ops.Op) -> tuple[str, ...]:
    """The group-form argument names ``op`` takes (from its global ``src``/``dst``)."""
    return tuple(g for k, g in GROUP_KEYS.items() if k in op.args)


def check_args(case: Case, op: ops.Op, args: dict[str, Any], path: Path) -> list[CaseFileError]:
    """``group_src``/``group_dst`` given to an op that has no such root, or with src/dst."""
    errs: list[CaseFileError] = []
    for key, gkey in GROUP_KEYS.items():
        if gkey not in args:
            continue
        if key not in op.args:
            errs.append(case.error((*path, gkey), f"{op.name} takes no argument {gkey!r}"))
        elif key in args:
            errs.append(case.error((*path, gkey), f"give either {key!r} (a global rank) or "
                                   f"{gkey!r} (a position in the group), not both"))
        for i, v in enumerate(args[gkey] if isinstance(args[gkey], list) else [args[gkey]]):
            if isinstance(v, str):
                try:
                    check_expr(case, (*path, gkey, i) if isinstance(args[gkey], list)
                               else (*path, gkey), v, ("rep",) if "repeat" in args else ())
                except CaseFileErrors as exc:
                    errs.extend(exc.errors)
    return errs


def check_p2p_entry(case: Case, path: Path, entry: dict[str, Any]) -> list[CaseFileError]:
    """A batch entry names its peer exactly once: ``peer`` (global) or ``group_peer``."""
    given = [k for k in ("peer", "group_peer") if k in entry]
    if len(given) != 1:
        return [case.error(path, "a p2p entry needs exactly one of 'peer' (a global rank) "
                           "and 'group_peer' (a position in the group)")]
    value = entry[given[0]]
    if isinstance(value, str):
        try:
            check_expr(case, (*path, given[0]), value)
        except CaseFileErrors as exc:
            return exc.errors
    return []
