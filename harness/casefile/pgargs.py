"""Collection-time checks and expansion of the process-group methods' arguments.

The ``pg.*`` ops (docs/reference/ops.md) take ``root_rank`` (a position in the
group, passed to torch unchecked) and ``root_tensor`` (each an integer or an expression over
``rank``, ``world_size`` and params), ``via`` (``group`` or ``backend``) and ``options``
(``object``, or per op ``int`` / ``overload``). Runs in the pytest process: no torch.
"""

from __future__ import annotations

from typing import Any

from ..errors import CaseFileError, CaseFileErrors, ExprError
from ..expr import Expr, parse
from ..model import Case
from .fields import as_list, check_expr

KEYS = ("root_rank", "root_tensor", "via", "options")
EXPR_KEYS = ("root_rank", "root_tensor")  # an integer or an expression
Path = tuple[Any, ...]


def check(case: Case, op: Any, values: dict[str, Any], path: Path,
          extra_names: tuple[str, ...] = (), entries: Any = None) -> list[CaseFileError]:
    """Problems of the pg arguments in ``values`` (a case's ``args`` or an op step).

    ``entries``: how many tensors the list buffer holds where collection knows it (the first
    dimension of a case's ``shape``, or a step's list of names), for the one-tensor overload.
    """
    errs: list[CaseFileError] = []
    if values.get("options") == "overload":
        if "root_tensor" in values:
            errs.append(case.error((*path, "root_tensor"), "the one-tensor overload takes no "
                                   "rootTensor", "drop root_tensor, or use options: object"))
        if isinstance(entries, int) and entries != 1:
            errs.append(case.error((*path, "options"), f"the one-tensor overload passes one "
                                   f"tensor; the list holds {entries}",
                                   "give the list one entry (shape: [1, ...])"))
    if (str(getattr(op, "name", "")).startswith("pg.") and "reduce_op" in (values.get("omit") or ())
            and values.get("options") != "overload"):
        errs.append(case.error((*path, "omit"), f"{op.name} leaves out the reduce op only in "
                               "its one-tensor overload (the list forms take options)",
                               "add 'options: overload'"))
    for key in EXPR_KEYS:
        raw = values.get(key)
        for j, v in enumerate(as_list(raw) if raw is not None else []):
            if isinstance(v, str):
                where = (*path, key, j) if isinstance(raw, list) else (*path, key)
                try:
                    check_expr(case, where, v, extra_names)
                except CaseFileErrors as exc:
                    errs.extend(exc.errors)
    if "options" in values:
        forms = getattr(op, "options_forms", ("object",))
        if values["options"] not in forms:
            errs.append(case.error((*path, "options"),
                                   f"{op.name} takes no options form {values['options']!r}",
                                   "allowed here: " + ", ".join(forms)))
    return errs


def step_value(key: str, value: Any, names: tuple[str, ...]) -> Any:
    """A step's pg argument as the interpreter takes it (expressions parsed)."""
    if key in EXPR_KEYS and isinstance(value, str):
        return parse(value, names)
    return value


def case_value(case: Case, key: str, value: Any, env: dict[str, Any]) -> Any:
    """A case's pg argument at one point of the matrix: a ``root_rank``/``root_tensor``
    expression stays an :class:`Expr` over ``rank`` too (evaluated on each rank), checked
    here on rank 0."""
    if key not in EXPR_KEYS or not isinstance(value, str):
        return value
    try:
        expr: Expr = parse(value, (*env, "rank"))
        expr({**env, "rank": 0})
    except (ExprError, KeyError, ZeroDivisionError) as exc:
        raise case.error(("args", key), f"bad {key} expression {value!r}: {exc}") from None
    return expr
