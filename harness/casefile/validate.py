"""Validate a loaded case file: JSON Schema first, then the checks a schema cannot express.

Every problem becomes a :class:`~harness.errors.CaseFileError` naming ``file:line:col``, the
key path, and what is allowed; all problems of a file are reported together.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from typing import Any

import jsonschema

from .. import dtypes, expr, ops
from ..errors import CaseFileError, CaseFileErrors, ExprError, quote
from ..model import Case
from . import (
    addressing,
    caseenv,
    cudasteps,
    entries,
    groups,
    lifecycle,
    opargs,
    patterns,
    pgargs,
    repeat,
    returns,
    sparse,
    workstate,
)
from .fields import KEYWORDS, as_list, check_expr, check_fill, suggest
from .load import Document, Path
from .steps import check_step

# pytest's own marks change what a run reports (xfail turns a failure into exit 0, skipif drops
# the record), so a case file, which may be untrusted, cannot carry them.
PYTEST_MARKS = ("skip", "skipif", "xfail", "usefixtures", "parametrize", "filterwarnings",
                "tryfirst", "trylast", "timeout", "flaky", "forked", "order", "run",
                "dependency", "no_cover", "asyncio", "anyio", "django_db", "collective")
OVERRIDE_NAMES = ("rank", "world_size", "i")  # what overrides.resolve gives an expression
STEP_ACTIONS = ("op", "wait", "sleep", "sync", "delay_stream", "write", "read", "future",
                "wait_tensor", "raise", "abort", "exit", "segfault", "new_group", "work_state",
                *lifecycle.LIFECYCLE_ACTIONS, *cudasteps.CUDA_STEPS)
# Op arguments a step may give besides src/dst/tag (each op lists the ones it takes).
STEP_OP_ARGS = ("form", "inplace", "splits", "timeout", "wait_all_ranks", *pgargs.KEYS)


@functools.cache
def case_schema() -> dict[str, Any]:
    """The JSON Schema of case files shipped in the package."""
    text = resources.files("harness").joinpath("schemas/case-file.schema.json").read_text()
    return dict(json.loads(text))


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(case_schema())


def _jsonable(value: Any) -> Any:
    """Copy with every mapping key as a string (JSON Schema only knows string keys)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _doc_path(doc: Document, parts: tuple[Any, ...]) -> Path:
    """Map a jsonschema path (string keys) back onto the document's keys (ints for ranks)."""
    out: list[str | int] = []
    for p in parts:
        if isinstance(p, str) and p.isdigit() and (*out, int(p)) in doc.positions:
            out.append(int(p))
        else:
            out.append(p)
    return tuple(out)


def _schema_message(err: jsonschema.ValidationError) -> tuple[str, str]:
    """A short message and a hint for one schema error."""
    v = err.validator
    schema: dict[str, Any] = err.schema if isinstance(err.schema, dict) else {}
    if v == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        instance: Any = err.instance
        extras = [k for k in instance if k not in schema.get("properties", {})]
        if allowed:
            return (f"unknown key {quote(extras[0], 80)}", suggest(str(extras[0])[:80], allowed))
        return (f"unknown key {quote(extras[0], 80)}", "")
    if v == "required":
        return (err.message.replace("is a required property", "is required here"), "")
    if v == "enum":
        return (f"{quote(err.instance, 80)} is not allowed",
                suggest(str(err.instance), [str(x) for x in schema.get("enum", [])]))
    if v == "anyOf" or v == "oneOf":
        inst = err.instance
        if isinstance(inst, str) and inst.lower() in ("yes", "no", "on", "off"):
            return (f"{inst!r} is a string here", "write true or false")
        # The branch that fits the value's type says what is wrong with it (a map's missing
        # key), not the branch of another type ("is not of type 'string'").
        shaped = [e for e in err.context or [] if e.validator not in ("type", "const")]
        best = jsonschema.exceptions.best_match(shaped) if shaped else None
        if best is not None and best.validator not in ("type", "anyOf"):
            return _schema_message(best)
        return (f"{_short(inst)} does not fit here", _expected_types(err))
    if v == "type":
        return (f"{_short(err.instance)} is not of type {err.validator_value}", "")
    if v == "dependentRequired" and isinstance(err.validator_value, dict):
        key = next((k for k in err.validator_value if isinstance(err.instance, dict)
                    and k in err.instance), "")
        needs = ", ".join(repr(n) for n in err.validator_value.get(key, ()))
        return (f"{key!r} needs {needs}", "without 'ranks' every rank must raise, so there "
                "are no other ranks to describe" if key == "others" else "")
    if v == "maxLength":
        return (f"{quote(err.instance, 60)} is longer than {err.validator_value} characters", "")
    if v == "uniqueItems":
        return (f"{_short(err.instance)} lists the same rank twice", "list each rank once")
    if v == "pattern" and isinstance(err.instance, str):
        return (f"{quote(err.instance, 80)} is not a valid name here",
                "use letters, digits, '_' (and '.', '-' in case names)")
    return (quote(err.message, 300)[1:-1], "")


def _expected_types(err: jsonschema.ValidationError) -> str:
    kinds: list[str] = []
    schema: dict[str, Any] = err.schema if isinstance(err.schema, dict) else {}
    for sub in schema.get("anyOf", schema.get("oneOf", [])):
        t = sub.get("type") or (repr(sub["const"]) if "const" in sub else
                                "a map" if "$ref" in sub else "")
        if isinstance(t, list):
            t = " or ".join(t)
        if t and t not in kinds:
            kinds.append(str(t))
    return "expected " + ", ".join(kinds) if kinds else ""


def _short(value: Any) -> str:
    return quote(value, 60)


def schema_errors(doc: Document) -> list[CaseFileError]:
    """All schema violations of ``doc``, sorted by position."""
    return [e for e, _ in _schema_problems(doc)]


def _schema_problems(doc: Document) -> list[tuple[CaseFileError, tuple[Any, ...]]]:
    """Schema violations with the raw document path each was found at."""
    found: list[tuple[CaseFileError, tuple[Any, ...]]] = []
    for err in _validator().iter_errors(_jsonable(doc.data)):
        path = _doc_path(doc, tuple(err.absolute_path))
        message, hint = _schema_message(err)
        at_key = False
        if err.validator == "additionalProperties":
            props = err.schema.get("properties", {}) if isinstance(err.schema, dict) else {}
            extra = next(k for k in err.instance if k not in props)
            key_path = (*path, int(extra) if (*path, extra) not in doc.positions
                        and str(extra).isdigit() else extra)
            if key_path in doc.positions:
                path, at_key = key_path, True
        found.append((doc.error(path, message, hint, at_key=at_key), tuple(err.absolute_path)))
    found.sort(key=lambda f: (f[0].pos.line, f[0].pos.col))
    return found


def load_cases(doc: Document) -> list[Case]:
    """Validate ``doc`` and return its cases; raises :class:`CaseFileErrors` on any problem."""
    if not isinstance(doc.data, dict):
        raise CaseFileErrors([doc.error((), "a case file must be a mapping with a 'cases:' list")])
    problems = _schema_problems(doc)
    errors = [e for e, _ in problems]
    # Cases the schema found wrong are not checked further, but every other case is, so a
    # file's problems are all reported in one go (a mistake outside the cases stops here).
    bad_cases = {p[1] for _, p in problems if len(p) > 1 and p[0] == "cases"}
    if any(len(p) < 2 or p[0] != "cases" for _, p in problems):
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
        raise CaseFileErrors(sorted(errors, key=lambda e: (e.pos.line, e.pos.col)))
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

    has_op, has_steps = "op" in raw, "steps" in raw
    if has_op == has_steps:
        errs.append(case.error(("name",), "a case needs exactly one of 'op' (one collective) "
                               "or 'steps' (a program)",
                               "see README: 'Writing a case'"))
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
    if has_op:
        if "tensors" in raw:
            errs.append(case.error(("tensors",), "'tensors' belongs to the 'steps' form",
                                   "with 'op:' describe the buffer with 'input' and 'shape'"))
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
        guard(check_steps, case)
    errs.extend(check_safety(case))
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
    timeout = raw.get("args", {}).get("timeout") if isinstance(raw.get("args"), dict) else None
    if isinstance(timeout, float) and not math.isfinite(timeout):
        errs.append(case.error(("args", "timeout"), f"timeout must be a finite number of "
                               f"seconds, got {timeout!r}"))
    for idx, step in enumerate(raw.get("steps", [])):
        for key in ("sleep", "delay", "delay_stream", "timeout", "group_timeout", "set_timeout"):
            value = step.get(key) if isinstance(step, dict) else None
            if isinstance(value, float) and not math.isfinite(value):
                errs.append(case.error(("steps", idx, key), f"{key} must be a finite number of "
                                       f"seconds, got {value!r}"))
    return errs


def check_steps(case: Case) -> None:
    """Check the steps form: tensors referenced exist, roles fit the op, handles are waited."""
    raw = case.raw
    tensors = raw.get("tensors", {})
    errs: list[CaseFileError] = []
    object_tensors = {n for n, spec in tensors.items() if spec.get("dtype") == "object"}
    for name, spec in tensors.items():
        try:
            (opargs.check_object_fill if name in object_tensors else check_fill)(
                case, ("tensors", name, "init"), spec["init"], False)
        except CaseFileErrors as exc:
            errs.extend(exc.errors)
        errs.extend(entries.check_tensor(case, name, spec))
        for i, dim in enumerate(spec.get("shape", [])):
            if isinstance(dim, str):
                try:
                    check_expr(case, ("tensors", name, "shape", i), dim)
                except CaseFileErrors as exc:
                    errs.extend(exc.errors)
    handles: set[str] = set()
    errs.extend(groups.check(case, raw["steps"]))
    errs.extend(cudasteps.check_program(case, STEP_ACTIONS))
    for path, step in cudasteps.walk(raw["steps"]):
        actions = [a for a in STEP_ACTIONS if a in step]
        if len(actions) != 1:
            errs.append(case.error(path, "a step needs exactly one of: " + ", ".join(STEP_ACTIONS)))
            continue
        action = actions[0]
        errs.extend(check_step(case, path, step, action, tensors, handles))
        errs.extend(lifecycle.check(case, path, step, action))
        errs.extend(returns.check(case, path, step))
        errs.extend(returns.check_warns(case, path, step))
        errs.extend(workstate.check(case, path, step, action, handles))
        step_op = ops.ALL_OPS.get(step.get("op", ""))
        errs.extend(repeat.check(case, path, step, action, tensors,
                                 tuple(r.name for r in step_op.roles) if step_op else ()))
        if isinstance(step.get("ranks"), str):
            try:
                check_expr(case, (*path, "ranks"), step["ranks"])
            except CaseFileErrors as exc:
                errs.extend(exc.errors)
        if action == "wait":
            for h in as_list(step["wait"]):
                if h not in handles:
                    errs.append(case.error((*path, "wait"), f"no earlier step has handle {h!r}",
                                           "give the async step 'handle: NAME' first"))
            continue
        if action != "op":
            continue
        if step["op"] not in ops.ALL_OPS:
            errs.append(case.error((*path, "op"), f"unknown op {step['op']!r}",
                                   suggest(step["op"], tuple(ops.ALL_OPS))))
            continue
        op = ops.get(step["op"])
        role_names = {r.name for r in op.roles}
        for role in op.roles:
            tname = step.get(role.name)
            if isinstance(tname, list):  # one list entry per named tensor
                errs.extend(_check_tensor_list(case, (*path, role.name), op, role, tname,
                                               tensors, object_tensors))
                continue
            holds_objects = bool(opargs.object_form(op, role.name))
            if tname is not None and tname in tensors and (
                    holds_objects != (tname in object_tensors)):
                errs.append(case.error(
                    (*path, role.name),
                    f"{op.name}'s {role.name!r} buffer "
                    + ("holds Python objects" if holds_objects else "is a tensor")
                    + f"; {tname!r} is "
                    + ("an object buffer" if tname in object_tensors else "a tensor"),
                    "declare object buffers with 'dtype: object'" if holds_objects
                    else "drop 'dtype: object' from it"))
            if tname is None:
                errs.append(case.error(path, f"{op.name} needs '{role.name}: TENSOR'",
                                       "name one of: " + ", ".join(tensors) if tensors else ""))
            elif tname not in tensors:
                errs.append(case.error((*path, role.name), f"unknown tensor {tname!r}",
                                       suggest(tname, tuple(tensors)) if tensors else
                                       "declare it under 'tensors:'"))
        for key in ("tensor", "input", "output", "objects"):
            if key in step and key not in role_names:
                errs.append(case.error((*path, key), f"{op.name} takes no {key!r} buffer",
                                       "its buffers: " + ", ".join(sorted(role_names))))
        for key in ("src", "dst", "tag", *STEP_OP_ARGS, "p2p"):
            if key in step and key not in (*op.args, *(("p2p",) if op.name ==
                                                     "batch_isend_irecv" else ())):
                errs.append(case.error((*path, key), f"{op.name} takes no argument {key!r}"))
            if key in ("src", "dst") and isinstance(step.get(key), str):
                try:
                    check_expr(case, (*path, key), step[key], repeat.names(step))
                except CaseFileErrors as exc:
                    errs.extend(exc.errors)
        for key in ("reduce_op", "premul_factor"):
            if key in step and not op.reduces:
                errs.append(case.error((*path, key), f"{op.name} does not reduce: "
                                       f"{key!r} does not apply", "drop it from this step"))
        if "reduce_op" in step and step["reduce_op"] not in dtypes.REDUCE_OPS:
            errs.append(case.error((*path, "reduce_op"),
                                   f"unknown reduce op {step['reduce_op']!r}",
                                   suggest(str(step["reduce_op"]), dtypes.REDUCE_OPS)))
        if isinstance(step.get("premul_factor"), str):
            try:
                check_expr(case, (*path, "premul_factor"), step["premul_factor"])
            except CaseFileErrors as exc:
                errs.extend(exc.errors)
        errs.extend(addressing.check_args(case, op, step, path))
        errs.extend(pgargs.check(case, op, step, path, repeat.names(step), entries=len(
            step["tensors"]) if isinstance(step.get("tensors"), list) else None))
        if "omit" in step and not op.defaults:
            errs.append(case.error((*path, "omit"), f"{op.name} takes no 'omit': it has no "
                                   "argument with a default the harness knows"))
        else:
            errs.extend(opargs.check_omit(case, op, step, path,
                                          step.get("reduce_op", raw.get("reduce_op"))))
        if op.name == "batch_isend_irecv" and "p2p" not in step:
            errs.append(case.error(path, "batch_isend_irecv needs 'p2p:' (a list of "
                                   "{op: isend|irecv, tensor: NAME, peer: RANK})"))
        for k, entry in enumerate(step.get("p2p", [])):
            if entry["tensor"] not in tensors:
                errs.append(case.error((*path, "p2p", k, "tensor"),
                                       f"unknown tensor {entry['tensor']!r}",
                                       suggest(entry["tensor"], tuple(tensors)) if tensors else
                                       "declare it under 'tensors:'"))
            errs.extend(addressing.check_p2p_entry(case, (*path, "p2p", k), entry))
        if "splits" in step:
            try:
                opargs.check_splits(case, (*path, "splits"), step["splits"])
            except CaseFileErrors as exc:
                errs.extend(exc.errors)
        for req in op.required_args:
            if req not in step and f"group_{req}" not in step and req not in step.get(
                    "omit", ()):
                errs.append(case.error(path, f"{op.name} needs '{req}:'"))
        if "handle" in step:
            handles.add(step["handle"])
    sources: list[tuple[Path, Any]] = [(("expected",), raw.get("expected", {}))]
    sources += [(("overrides", i, "expected"), o["expected"])
                for i, o in enumerate(raw.get("overrides", []))
                if isinstance(o, dict) and "expected" in o]
    for epath, expected in sources:  # an override's expected: has the program's form too
        if not isinstance(expected, dict) or "generator" in expected:
            errs.append(case.error(epath, "with 'steps', expected maps tensor names to values",
                                   "e.g. expected: {out: {0: [1, 2], 1: [3, 4]}}"))
            continue
        for tname, fill in expected.items():
            if tname not in tensors:
                errs.append(case.error((*epath, tname), f"unknown tensor {tname!r}",
                                       suggest(str(tname), tuple(tensors))))
                continue
            try:
                (opargs.check_object_fill if tname in object_tensors else check_fill)(
                    case, (*epath, tname), fill, True)
            except CaseFileErrors as exc:
                errs.extend(exc.errors)
    if errs:
        raise CaseFileErrors(errs)


def _check_tensor_list(case: Case, path: Path, op: ops.Op, role: ops.Role, names: list[Any],
                       tensors: dict[str, Any], object_tensors: set[str]
                       ) -> list[CaseFileError]:
    """A list role given as a list of tensor names (entries of any shape and dtype); a
    nested role's entries may be lists of names themselves (``[[a, b], [c, d]]``)."""
    if role.form not in ("list", "nested"):
        return [case.error(path, f"{op.name}'s {role.name!r} buffer is not a list of tensors",
                           "give one tensor name")]
    errs: list[CaseFileError] = []
    flat: list[tuple[Path, Any]] = []
    for i, item in enumerate(names):
        if isinstance(item, list) and role.form != "nested":
            errs.append(case.error((*path, i), f"{op.name}'s {role.name!r} buffer is a list "
                                   "of tensors, not a list of lists", "give tensor names"))
        elif isinstance(item, list):
            flat.extend(((*path, i, k), n) for k, n in enumerate(item))
        else:
            flat.append(((*path, i), item))
    for where, name in flat:
        if name not in tensors:
            errs.append(case.error(where, f"unknown tensor {name!r}",
                                   suggest(name, tuple(tensors)) if tensors else
                                   "declare it under 'tensors:'"))
        elif name in object_tensors:
            errs.append(case.error(where, f"{name!r} is an object buffer; list entries "
                                   "are tensors"))
    return errs
