"""Pieces of case-file checking and parsing shared by validation, steps and expansion.

Fill keywords, the names an expression may use, expression and fill checks that fail at the
value's line, and the parse of a tensor fill. Runs in the pytest process: no torch.
"""

from __future__ import annotations

import difflib
from typing import Any

from ..errors import CaseFileErrors, ExprError, quote
from ..expr import FUNCTIONS, parse
from ..model import Case, Fill, Tolerance

KEYWORDS = ("poison", "zeros", "unspecified", "unchanged", "auto")
BASE_NAMES = ("rank", "world_size")
# Every name the harness itself gives an expression somewhere: the element indices of fills
# (i, j, k), the peers of all_to_all_single splits (src, dst), a repeated step's repetition
# (rep), and the expression functions. A case parameter named like one of them would be
# silently shadowed in some expressions (or shadow the built-in in others): refused.
RESERVED_NAMES = (*BASE_NAMES, "i", "j", "k", "src", "dst", "rep", *FUNCTIONS)
Path = tuple[Any, ...]


def as_list(value: Any) -> list[Any]:
    """A scalar-or-list case value as a list."""
    return value if isinstance(value, list) else [value]


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """A "did you mean" hint, or the list of what is allowed."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return "allowed: " + ", ".join(sorted(choices))


def expr_names(case: Case) -> tuple[str, ...]:
    """Names an expression in this case may use."""
    return (*BASE_NAMES, *case.raw.get("params", {}).keys(),
            *(case.raw.get("tables") or {}).keys())


def check_expr(case: Case, path: Path, source: str, extra: tuple[str, ...] = ()) -> None:
    """Parse an expression now, so a bad one fails collection at its line."""
    try:
        parse(source, (*expr_names(case), *extra))
    except ExprError as exc:
        raise CaseFileErrors([case.error(path, f"bad expression {quote(source)}: {exc}")]) from None


def check_fill(case: Case, path: Path, value: Any, expected: bool, depth: int = 0) -> None:
    """Check a fill (input or expectation) and every expression in it."""
    if value is None:
        raise CaseFileErrors([case.error(path, "null is not a tensor value",
                                         "give a number, a list, an expression or a keyword")])
    if isinstance(value, dict) and "same_values" in value:
        raise CaseFileErrors([case.error(path, "same_values compares two buffers of a program",
                                         "give it under a program's expected: for one buffer, "
                                         "e.g. expected: {hier: {same_values: flat}}")])
    if isinstance(value, dict) and "generator" not in value:
        if depth > 0:
            raise CaseFileErrors([case.error(path, "a per-rank value cannot be another map",
                                             "give a list, a number, an expression, a keyword "
                                             "or {generator: ...}")])
        for k, v in value.items():
            check_fill(case, (*path, k), v, expected, depth + 1)
        return
    if isinstance(value, dict) and value.get("generator") == "objects":
        raise CaseFileErrors([case.error(path, "the 'objects' generator is for object buffers",
                                         "tensors take exact, ranks, random, constant, nan_inf")])
    if isinstance(value, str):
        if value in KEYWORDS:
            allowed_here = ("unspecified", "unchanged", "auto") if expected else ("poison", "zeros")
            if value not in allowed_here:
                raise CaseFileErrors([case.error(
                    path, f"{value!r} cannot be used here",
                    "allowed: " + ", ".join(allowed_here) + ", a list, or an expression")])
            return
        check_expr(case, path, value, ("i", "j", "k"))


def parse_fill(case: Case, raw: Any) -> Fill:
    """Turn a raw YAML tensor fill into a :class:`Fill` (expressions parsed, not evaluated).

    Object buffers take :func:`harness.casefile.opargs.parse_object_fill` instead.
    """
    if isinstance(raw, dict) and "same_values" in raw:
        given = any(k in raw for k in ("atol", "rtol", "ulp"))
        tol = Tolerance(atol=float(raw.get("atol", 0)), rtol=float(raw.get("rtol", 0)),
                        ulp=float(raw.get("ulp", 0))) if given else None
        return Fill("same_values", (str(raw["same_values"]), tol))
    if isinstance(raw, dict) and "generator" in raw:
        params = {k: v for k, v in raw.items() if k != "generator"}
        return Fill("generator", (raw["generator"], tuple(sorted(params.items()))))
    if isinstance(raw, dict):
        return Fill("per_rank", {k: parse_fill(case, v) for k, v in raw.items()})
    if isinstance(raw, str):
        if raw in KEYWORDS:
            return Fill(raw)  # type: ignore[arg-type]
        return Fill("expr", parse(raw, (*expr_names(case), "i", "j", "k")))
    return Fill("list", raw)
