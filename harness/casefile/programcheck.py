"""The checks of a ``steps:`` program that a schema cannot express: one action per step,
the op arguments each op takes, tensor names that exist, waits of handles that were issued,
lists of tensors of the right length, per-step ranks within the world.
"""


from typing import Any

from .. import dtypes, ops
from ..errors import CaseFileError, CaseFileErrors
from ..model import Case
from . import (
    addressing,
    coverage,
    cudasteps,
    entries,
    groups,
    lifecycle,
    opargs,
    pgargs,
    repeat,
    returns,
    workstate,
)
from .fields import as_list, check_expr, check_fill, suggest
from .load import Path
from .steps import check_step

STEP_ACTIONS = ("op", "wait", "sleep", "sync", "delay_stream", "write", "read", "future",
                "wait_tensor", "raise", "abort", "exit", "segfault", "new_group", "work_state",
                *lifecycle.LIFECYCLE_ACTIONS, *cudasteps.CUDA_STEPS)


# Op arguments a step may give besides src/dst/tag (each op lists the ones it takes).
STEP_OP_ARGS = ("form", "inplace", "splits", "timeout", "wait_all_ranks", *pgargs.KEYS)


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
                                 tuple(r.name for r in step_op.roles) if step_op else (),
                                 tuple(r.name for r in step_op.roles
                                       if r.form in ("list", "nested")) if step_op else ()))
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
            if isinstance(tname, list) and repeat.per_repetition(step, role.form):
                continue  # one tensor per repetition: checked by repeat.check
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
            if key in step and key not in (*op.args, *(("p2p",) if op.p2p_entries else ())):
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
        if op.p2p_entries and "p2p" not in step:
            errs.append(case.error(path, f"{op.name} needs 'p2p:' (a list of "
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
    errs.extend(_check_case_reduce_op(case))
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
    errs.extend(coverage.check(case))
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


def _check_case_reduce_op(case: Case) -> list[CaseFileError]:
    """A case-level ``reduce_op:`` that no call of the program uses would still name the
    instances (``-max-``) and so claim a reduction that was never checked."""
    if "reduce_op" not in case.raw:
        return []
    reducing = [s for _, s in cudasteps.walk(case.raw["steps"]) if isinstance(s, dict)
                and s.get("op") in ops.ALL_OPS and ops.get(s["op"]).reduces]
    if any("reduce_op" not in s for s in reducing):
        return []
    why = ("every reducing step names its own reduce_op" if reducing
           else "no step of this program reduces")
    return [case.error(("reduce_op",), f"the case's reduce_op is used by no call: {why}",
                       "remove it, or drop reduce_op from the steps that should take the "
                       "case's value")]
