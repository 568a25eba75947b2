"""``tables:``: named tables of numbers that a case's expressions index.

A table is a list of numbers or of tables (``routes: [[0, 2], [1, 1]]``), given once for the
case and indexed in any expression of it: ``splits: "routes[src][dst]"``, ``shape:
["sizes[rank]"]``, ``input: "weights[i]"`` (a per-element index gathers from a row of
numbers). It is not an axis: every instance sees the whole table. Indexing is checked when
the expression is evaluated (an index out of range, a row used as a number); see
:mod:`harness.expr`.
"""

from __future__ import annotations

from typing import Any

from ..errors import CaseFileError
from ..model import Case
from .fields import RESERVED_NAMES

MAX_DEPTH = 4  # routes[src][dst] needs 2; a per-rank, per-step, per-peer table 3
MAX_NUMBERS = 65_536


def _size(value: Any, depth: int) -> tuple[int, int]:
    """(numbers, deepest nesting) of a table the schema accepted."""
    if not isinstance(value, list):
        return 1, depth
    count, deepest = 0, depth + 1
    for v in value:
        n, d = _size(v, depth + 1)
        count, deepest = count + n, max(deepest, d)
        if count > MAX_NUMBERS or deepest > MAX_DEPTH:
            break  # bounded work on a hostile table
    return count, deepest


def check(case: Case) -> list[CaseFileError]:
    """Each table's name is free (not a name the harness gives expressions, not a param) and
    its size bounded."""
    raw = case.raw
    given = raw.get("tables")
    if not isinstance(given, dict):
        return []
    errs: list[CaseFileError] = []
    params = raw.get("params") or {}
    for name, value in given.items():
        full = (*case.origin.get("tables", ()), name)
        if name in RESERVED_NAMES or name in params:
            what = ("a param of this case" if name in params else
                    "a name the harness itself gives expressions (" + ", ".join(RESERVED_NAMES)
                    + ")")
            errs.append(case.doc.error(full, f"tables: {name!r} is {what}",
                                       "rename the table", at_key=True))
            continue
        count, depth = _size(value, 0)
        if depth > MAX_DEPTH or count > MAX_NUMBERS:
            errs.append(case.doc.error(full, f"tables: {name!r} is larger than a table may be "
                                       f"({MAX_NUMBERS:,} numbers, {MAX_DEPTH} levels of "
                                       "lists)", "split it, or compute the values with an "
                                       "expression"))
    return errs


def as_env(case: Case) -> dict[str, Any]:
    """The case's tables as the values expressions index (nested tuples)."""
    def frozen(value: Any) -> Any:
        return tuple(frozen(v) for v in value) if isinstance(value, list) else value
    given = case.raw.get("tables")
    return {str(k): frozen(v) for k, v in given.items()} if isinstance(given, dict) else {}
