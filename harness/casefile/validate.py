"""Validate a loaded case file: JSON Schema first, then the checks a schema cannot express.

Every problem becomes a :class:`~harness.errors.CaseFileError` naming ``file:line:col``, the
key path, and what is allowed; all problems of a file are reported together.
"""

from __future__ import annotations

import math
from typing import Any

from .. import dtypes, expr, ops
from ..errors import CaseFileError, CaseFileErrors, ExprError, quote
from ..model import Case
from . import (
    addressing,
    caseenv,
    coverage,
    entries,
    numerics,
    opargs,
    patterns,
    pgargs,
    programcheck,
    sparse,
    tables,
)
from .fields import KEYWORDS, RESERVED_NAMES, as_list, check_expr, check_fill, suggest
from .load import Document, Path
from .overrides import ROOT_NAMES
from .schema import schema_problems

# pytest's own marks change what a run reports (xfail turns a failure into exit 0, skipif drops
# the record), so a case file, which may be untrusted, cannot carry them.
PYTEST_MARKS = ("skip", "skipif", "xfail", "usefixtures", "parametrize", "filterwarnings",
                "tryfirst", "trylast", "timeout", "flaky", "forked", "order", "run",
                "dependency", "no_cover", "asyncio", "anyio", "django_db", "collective")
OVERRIDE_NAMES = ("rank", "world_size", "i")  # what overrides.resolve gives an expression


def load_cases(doc: Document) -> list[Case]:
    """Validate ``doc`` and return its cases; raises :class:`CaseFileErrors` on any problem."""
    if not isinstance(doc.data, dict):
        raise CaseFileErrors([doc.error((), "a case file must be a mapping with a 'cases:' list")])
    problems = schema_problems(doc)
    errors = [e for e, _, _ in problems]
    # Every problem of a file is reported in one go. A case whose only schema problems are
    # unknown keys of its own (typos) is checked further without them; a case with any other
    # schema problem is not (its values may not have the shapes the checks expect). A mistake
    # outside the cases stops here.
    in_case = [(p, unknown) for _, p, unknown in problems if len(p) > 1 and p[0] == "cases"]
    bad_cases = {p[1] for p, unknown in in_case if not (unknown and len(p) == 3)}
    typos = {(p[1], p[2]) for p, unknown in in_case if unknown and len(p) == 3}
    if any(len(p) < 2 or p[0] != "cases" for _, p, _ in problems):
        raise CaseFileErrors(errors)
    defaults: dict[str, Any] = doc.data.get("defaults") or {}
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for idx, raw_case in enumerate(doc.data["cases"]):
        merged: dict[str, Any] = {}
        origin: dict[str, Path] = {}
        for key, value in defaults.items():
            merged[key] = value
            origin[key] = ("defaults", key)
        for key, value in raw_case.items():
            if (idx, key) in typos:
                continue  # reported as an unknown key; the rest of the case is checked
            merged[key] = value
            origin[key] = ("cases", idx, key)
        if idx in bad_cases:
            continue
        line = doc.pos(("cases", idx)).line
        case = Case(file=doc.file, line=line, name=merged["name"],
                    description=str(merged.get("description", "")), raw=merged, origin=origin,
                    doc=doc)
        if case.name in seen:
            errors.append(case.error(("name",), f"duplicate case name {case.name!r} "
                                     f"(first at line {seen[case.name]})",
                                     "case names must be unique within a file"))
        seen[case.name] = line
        try:
            check_case(case)
        except CaseFileErrors as exc:
            errors.extend(exc.errors)
        cases.append(case)
    if errors:
        # A mistake under defaults: is found once per case that inherits it: said once.
        unique = list({e.render(): e for e in errors}.values())
        raise CaseFileErrors(sorted(unique, key=lambda e: (e.pos.line, e.pos.col)))
    return cases


def check_case(case: Case) -> None:
    """Schema-independent checks on one case (names, ops, dtypes, expressions, steps)."""
    raw = case.raw
    errs: list[CaseFileError] = []

    def guard(fn: Any, *a: Any) -> None:
        try:
            fn(*a)
        except CaseFileErrors as exc:
            errs.extend(exc.errors)

    for name in raw.get("params", {}) or {}:
        if name in RESERVED_NAMES:
            full = (*case.origin.get("params", ()), name)
            errs.append(case.doc.error(full, f"params: {name!r} is a name the harness itself "
                                       "gives expressions (" + ", ".join(RESERVED_NAMES) + ")",
                                       "rename the parameter", at_key=True))
    errs.extend(tables.check(case))
    has_op, has_steps = "op" in raw, "steps" in raw
    if has_op == has_steps:
        errs.append(case.error(("name",), "a case needs exactly one of 'op' (one collective) "
                               "or 'steps' (a program)",
                               "see docs/reference/case-format.md"))
    if has_op and raw["op"] not in ops.ALL_OPS:
        errs.append(case.error(("op",), f"unknown op {raw['op']!r}",
                               suggest(raw["op"], tuple(ops.ALL_OPS))))
    for i, name in enumerate(as_list(raw.get("dtype", "float32"))):
        if dtypes.canonical(name) is None:
            path: Path = ("dtype", i) if isinstance(raw.get("dtype"), list) else ("dtype",)
            errs.append(case.error(path, f"unknown dtype {name!r}",
                                   suggest(name, (*dtypes.DTYPES, *dtypes.ALIASES))))
    for i, name in enumerate(as_list(raw.get("reduce_op", "sum"))):
        if name not in dtypes.REDUCE_OPS:
            path = ("reduce_op", i) if isinstance(raw.get("reduce_op"), list) else ("reduce_op",)
            errs.append(case.error(path, f"unknown reduce op {name!r}",
                                   suggest(name, dtypes.REDUCE_OPS)))
    declared = [k for k in ("raises", "hangs", "crashes") if raw.get(k)]
    if len(declared) > 1:
        errs.append(case.error((declared[1],), f"'{declared[0]}' and '{declared[1]}' "
                               "cannot both be expected"))
    if has_steps and "call_returns" in raw:
        errs.append(case.error(("call_returns",), "a case's 'call_returns' belongs to the "
                               "'op:' form", "in a program give it on the op step"))
    if has_op and "call_returns" in raw and raw.get("raises"):
        errs.append(case.error(("call_returns",), "a call that must raise returns nothing",
                               "drop 'call_returns' or 'raises'"))
    if has_op:
        if "tensors" in raw:
            errs.append(case.error(("tensors",), "'tensors' belongs to the 'steps' form",
                                   "with 'op:' describe the buffer with 'input' and 'shape'"))
        if "unchecked" in raw:
            errs.append(case.error(("unchecked",), "'unchecked' belongs to the 'steps' form",
                                   "with 'op:' the output is always checked; drop it"))
        if "input" not in raw and raw.get("op") in ops.ALL_OPS and ops.get(raw["op"]).in_role:
            errs.append(case.error(("name",), "'input' is required with 'op'",
                                   "give per-rank values, an expression over i, or a generator"))
        op_entry = ops.ALL_OPS.get(raw.get("op", ""))
        in_obj = op_entry is not None and bool(opargs.object_form(op_entry, op_entry.in_role))
        out_obj = op_entry is not None and bool(opargs.object_form(op_entry,
                                                                   op_entry.out_role))
        guard(opargs.check_object_fill if in_obj else check_fill, case, ("input",),
              raw.get("input", 0), False)
        guard(opargs.check_object_fill if out_obj else check_fill, case, ("expected",),
              raw.get("expected", "auto"), True)
        if raw.get("op") in ops.ALL_OPS:
            op = ops.get(raw["op"])
            args = raw.get("args", {})
            errs.extend(addressing.check_args(case, op, args, ("args",)))
            shape = raw.get("shape")
            errs.extend(pgargs.check(case, op, args, ("args",), entries=shape[0] if isinstance(
                shape, list) and shape and isinstance(shape[0], int) else None))
            errs.extend(opargs.check_omit(case, op, args, ("args",), raw.get("reduce_op")))
            for req in op.required_args:
                if req not in args and f"group_{req}" not in args and req not in args.get(
                        "omit", ()):
                    errs.append(case.error(("name",), f"op {op.name} needs args.{req}",
                                           f"add 'args: {{{req}: 0}}'"))
            if isinstance(args.get("premul_factor"), str):
                guard(check_expr, case, ("args", "premul_factor"), args["premul_factor"])
            for key in args:
                if key not in (*op.args, "group", "premul_factor", "premul_tensor",
                               *addressing.allowed(op), *(("omit",) if op.defaults else ())):
                    errs.append(case.error(("args", key), f"op {op.name} takes no argument "
                                           f"{key!r}", suggest(key, (*op.args, "group"))))
    guard(entries.check_case, case)
    errs.extend(caseenv.check(case))
    errs.extend(sparse.check_case(case))
    if has_steps:
        guard(programcheck.check_steps, case)
    errs.extend(check_safety(case))
    errs.extend(numerics.check(case))
    for i, dim in enumerate(raw.get("shape", [])):
        if isinstance(dim, str):
            guard(check_expr, case, ("shape", i), dim)
    for key in ("src", "dst"):
        for j, v in enumerate(as_list(raw.get("args", {}).get(key, []))):
            if isinstance(v, str):
                guard(check_expr, case, ("args", key, j) if isinstance(
                    raw["args"][key], list) else ("args", key), v)
    if "splits" in raw.get("args", {}):
        guard(opargs.check_splits, case, ("args", "splits"), raw["args"]["splits"])
    if not errs:  # what a program compares is a question only once it is well formed
        errs.extend(coverage.check(case) if has_steps else coverage.check_shorthand(case))
    if errs:
        raise CaseFileErrors(errs)


def _pattern_error(case: Case, path: Path, pattern: Any) -> CaseFileError | None:
    if not isinstance(pattern, str):
        return None
    try:
        patterns.compile_pattern(pattern)
    except patterns.PatternError as exc:
        return case.error(path, f"bad pattern {quote(pattern)}: {exc}")
    return None


def _override_exprs(case: Case, path: Path, value: Any) -> list[CaseFileError]:
    """Expressions in an override's ``expected`` (resolved at run time, so checked now)."""
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in _override_exprs(case, (*path, k), v)]
    if isinstance(value, str) and value not in KEYWORDS:
        try:
            expr.parse(value, OVERRIDE_NAMES)
        except ExprError as exc:
            return [case.error(path, f"bad expression {quote(value)}: {exc}")]
    return []


def check_safety(case: Case) -> list[CaseFileError]:
    """Patterns that compile, marks that cannot change pytest's verdict, finite numbers."""
    raw = case.raw
    errs: list[CaseFileError] = []
    sources: list[tuple[Path, Any]] = [(("raises",), raw.get("raises"))]
    sources += [(("overrides", i, "raises"), o.get("raises"))
                for i, o in enumerate(raw.get("overrides", [])) if isinstance(o, dict)]
    for path, value in sources:
        if isinstance(value, dict):
            for k, rank in enumerate(value.get("ranks") or ()):
                if isinstance(rank, str):  # an expression: names checked now, value later
                    try:
                        check_expr(case, (*path, "ranks", k), rank, ROOT_NAMES)
                    except CaseFileErrors as exc:
                        errs.extend(exc.errors)
            path, value = (*path, "match"), value.get("match")
        err = _pattern_error(case, path, value)
        if err is not None:
            errs.append(err)
    for i, mark in enumerate(raw.get("marks", [])):
        if mark in PYTEST_MARKS:
            errs.append(case.error(("marks", i), f"mark {mark!r} is pytest's own and cannot be "
                                   "set by a case file",
                                   "use expected outcomes (raises, hangs, crashes, overrides "
                                   "with xfail/skip and a reason) instead"))
    tolerances: list[tuple[Path, Any]] = [(("tolerance",), raw.get("tolerance"))]
    tolerances += [(("overrides", i, "tolerance"), o.get("tolerance"))
                   for i, o in enumerate(raw.get("overrides", [])) if isinstance(o, dict)]
    for path, tol in tolerances:
        if not isinstance(tol, dict):  # `tolerance: auto` (or nothing): no numbers to check
            continue
        for key, value in tol.items():
            if isinstance(value, float) and not math.isfinite(value):
                errs.append(case.error((*path, key), f"tolerance {key} must be finite, got "
                                       f"{value!r}", "an infinite tolerance accepts any value"))
    for i, o in enumerate(raw.get("overrides", [])):
        if isinstance(o, dict) and "expected" in o and "steps" not in raw:
            errs.extend(_override_exprs(case, ("overrides", i, "expected"), o["expected"]))
    for key in ("pg_timeout", "deadline"):
        # The schema's range checks let .nan through (every comparison with NaN is false).
        value = raw.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            errs.append(case.error((key,), f"{key} must be a finite number of seconds, got "
                                   f"{value!r}"))
    timeout = raw.get("args", {}).get("timeout") if isinstance(raw.get("args"), dict) else None
    if isinstance(timeout, float) and not math.isfinite(timeout):
        errs.append(case.error(("args", "timeout"), f"timeout must be a finite number of "
                               f"seconds, got {timeout!r}"))
    for idx, step in enumerate(raw.get("steps", [])):
        # group_timeout and set_timeout: harness.casefile.lifecycle says it (once).
        for key in ("sleep", "delay", "delay_stream", "timeout"):
            value = step.get(key) if isinstance(step, dict) else None
            if isinstance(value, float) and not math.isfinite(value):
                errs.append(case.error(("steps", idx, key), f"{key} must be a finite number of "
                                       f"seconds, got {value!r}"))
    return errs


