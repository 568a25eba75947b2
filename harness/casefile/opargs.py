"""Collection-time handling of the case-format pieces specific to some ops.

Object buffers (the object collectives), ``splits`` matrices (uneven ``all_to_all_single``)
and per-rank shapes are parsed and checked here, so that :mod:`harness.casefile.validate` and
:mod:`harness.casefile.expand` only call in. Runs in the pytest process: no torch.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import CaseFileError, CaseFileErrors, ExprError, quote
from ..expr import parse
from ..model import Case, Fill
from .fields import KEYWORDS, expr_names

SPLIT_NAMES = ("src", "dst")
Path = tuple[Any, ...]


def object_form(op: Any, role_name: str) -> str:
    """"object"/"objects" if the op's buffer ``role_name`` holds Python objects, else ""."""
    if not role_name:
        return ""
    try:
        form = str(op.role(role_name).form)
    except KeyError:
        return ""
    return form if form in ("object", "objects") else ""


def _is_rank_map(raw: Any) -> bool:
    return isinstance(raw, dict) and bool(raw) and "generator" not in raw and all(
        isinstance(k, int) or k == "others" for k in raw)


def parse_object_fill(raw: Any, top: bool = True) -> Fill:
    """An object buffer's fill: plain data, taken verbatim (strings stay strings).

    Only a top-level map keyed by ranks/``others`` is a per-rank map, so a dict object for
    every rank is written ``{others: {...}}``.
    """
    if isinstance(raw, dict) and "generator" in raw:
        params = {k: v for k, v in raw.items() if k != "generator"}
        return Fill("generator", (raw["generator"], tuple(sorted(params.items()))))
    if top and _is_rank_map(raw):
        return Fill("per_rank", {k: parse_object_fill(v, top=False) for k, v in raw.items()})
    if isinstance(raw, str) and raw in KEYWORDS:
        return Fill(raw)  # type: ignore[arg-type]
    return Fill("list", raw)


def check_object_fill(case: Case, path: Path, value: Any, expected: bool) -> None:
    """Object buffers take plain data: only the keywords and the generator are checked."""
    keywords = ("auto", "unchanged", "unspecified") if expected else ("poison",)
    entries = value.items() if _is_rank_map(value) else [((), value)]
    for key, v in entries:
        where = (*path, key) if key != () else path
        if isinstance(v, str) and v in KEYWORDS and v not in keywords:
            raise CaseFileErrors([case.error(where, f"{v!r} cannot be used here",
                                             "allowed: " + ", ".join(keywords))])
        if isinstance(v, dict) and v.get("generator") not in (None, "objects"):
            raise CaseFileErrors([case.error(where, "object buffers take the 'objects' "
                                             "generator", "write {generator: objects, seed: 1}")])


def _names(case: Case) -> tuple[str, ...]:
    return expr_names(case)


def check_splits(case: Case, path: Path, value: Any) -> None:
    """``splits``: an expression over src and dst, or a matrix of counts/expressions."""
    cells = [(path, value)] if isinstance(value, str) else [
        ((*path, i, j), c) for i, row in enumerate(value) for j, c in enumerate(row)]
    for where, cell in cells:
        if isinstance(cell, str):
            try:
                parse(cell, (*_names(case), *SPLIT_NAMES))
            except ExprError as exc:
                raise CaseFileErrors([case.error(where, f"bad expression {quote(cell)}: {exc}")]
                                     ) from None
        elif cell < 0:
            raise CaseFileErrors([case.error(where, "split sizes cannot be negative")])


def eval_splits(case: Case, value: Any, n: int, env: dict[str, Any], path: Path
                ) -> tuple[tuple[int, ...], ...]:
    """The ``splits`` matrix for a group of ``n`` (rows sent from member s to member d)."""
    names = (*env, *SPLIT_NAMES)
    try:
        if isinstance(value, str):
            fn = parse(value, names)
            m = [[fn({**env, "src": s, "dst": d}) for d in range(n)] for s in range(n)]
        else:
            m = [[parse(c, names)(env) if isinstance(c, str) else c for c in row]
                 for row in value]
    except (ExprError, KeyError) as exc:
        raise case.error(path, f"bad splits: {exc}") from None
    if len(m) != n or any(len(row) != n for row in m):
        raise case.error(path, f"splits must be a {n}x{n} matrix (rows sent from each of the "
                         f"{n} group member(s) to each)", "or give an expression over src and dst")
    if any(not isinstance(c, int) or c < 0 for row in m for c in row):
        raise case.error(path, "split sizes must be whole numbers >= 0")
    return tuple(tuple(int(c) for c in row) for row in m)


def uses_rank(shape: list[Any]) -> bool:
    """Whether a shape has an entry that depends on the rank (a per-rank shape)."""
    return any(isinstance(d, str) and re.search(r"\brank\b", d) for d in shape)


def check_omit(case: Case, op: Any, given: dict[str, Any], path: Path,
               reduce_op: Any = None) -> list[CaseFileError]:
    """``omit: [...]``: arguments left out so that torch's default is tested.

    Only arguments the op table documents a default for may be omitted (``op.defaults``), not
    together with a value for them, and ``reduce_op`` only where the case's reduce op is that
    default (the harness computes the expectation with it). ``reduce_op`` is the case's (or
    the step's) reduce op, or None when not given.
    """
    names = given.get("omit")
    if names is None:
        return []
    defaults = dict(op.defaults)
    errs: list[CaseFileError] = []
    for i, name in enumerate(names):
        where = (*path, "omit", i)
        if name not in defaults:
            errs.append(case.error(where, f"{op.name} has no argument {name!r} with a default "
                                   "the harness knows",
                                   "it can omit: " + (", ".join(defaults) or "nothing")))
        elif name in given or f"group_{name}" in given:
            key = name if name in given else f"group_{name}"
            errs.append(case.error((*path, key), f"{key!r} is given and omitted: choose one",
                                   f"drop it to test torch's default ({defaults[name]!r})"))
        elif name == "reduce_op" and reduce_op is not None and any(
                r != defaults[name] for r in (reduce_op if isinstance(reduce_op, list)
                                              else [reduce_op])):
            errs.append(case.error(where, f"with 'reduce_op' omitted torch reduces with its "
                                   f"default ({defaults[name]}); the case says "
                                   f"{quote(reduce_op, 60)}",
                                   f"drop 'reduce_op' or set it to {defaults[name]}"))
    return errs
