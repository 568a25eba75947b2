"""The checks of a ``steps:`` program that a schema cannot express, common to every step:
one action per step, keys that belong to other kinds (``ONLY_WITH``), ``raises``/timeouts,
``returns``/``warns``, ``repeat``/``slices``, the ``ranks`` expression, the declared tensors
and the ``expected:`` section. What a kind checks of its own steps (an op's buffers and
arguments, the handles a wait names, ...) is the kind's: see :mod:`harness.casefile.stepkinds`,
which this module dispatches to.
"""


from collections.abc import Callable
from typing import Any

from .. import ops
from ..errors import CaseFileError, CaseFileErrors
from ..model import Case
from . import entries, lifecycle, numerics, opargs, repeat, returns, stepkinds
from .fields import check_expr, check_fill, suggest
from .load import Path
from .stepkinds import work_state
from .stepkinds.base import CheckContext, Stage
from .stepkinds.cuda import devices

OP_KEYS = ("tensor", "input", "output", "src", "dst", "tag", "group", "async", "handle",
           "reduce_op", "premul_factor", "root_rank", "root_tensor", "via", "options",
           "omit", "register_work", "call_returns")
# Keys that belong to some step kinds only; anything else is a mistake worth naming. The
# order of the entries is the order a step's misplaced keys are reported in.
ONLY_WITH: dict[str, tuple[str, ...]] = {
    "value": ("write",), "delay": ("write",), "expect": ("read", "future"),
    "as": ("read", "future"), "thread": ("wait",), "stream": ("op",), "result": ("future",),
    **{k: ("op",) for k in OP_KEYS},
}
ONLY_WITH["tensor"] = ("op", "future")
# Timeouts, expected step errors and group lifecycle (harness.casefile.lifecycle).
ONLY_WITH["group"] = ("op", "set_timeout", "destroy", "abort_group", "seq_number",
                      "enable_timing")
ONLY_WITH.update({"group_timeout": ("op", "set_timeout", "destroy", "abort_group"),
                  "raises": ("op", "wait", "set_timeout", "destroy", "abort_group", "reform",
                             "shrink"),
                  "blocks_until_all": ("op",)})
ONLY_WITH["register_work"] = ("op", "wait")
ONLY_WITH.update({"steps": ("capture",), "times": ("replay",), "then": ("future",),
                 "held": ("future",)})
CommonCheck = Callable[[Case, Path, dict[str, Any], str], list[CaseFileError]]


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
    ctx = CheckContext(case, tensors, frozenset(object_tensors), set(), stepkinds.STEP_ACTIONS)
    errs.extend(stepkinds.check_program(ctx))
    for path, step in stepkinds.walk(raw["steps"]):
        actions = stepkinds.actions_of(step)
        if len(actions) != 1:
            errs.append(case.error(path, "a step needs exactly one of: "
                                   + ", ".join(stepkinds.STEP_ACTIONS)))
            continue
        action = actions[0]
        kind = stepkinds.BY_ACTION[action]
        for stage, common in COMMON_CHECKS:
            errs.extend(common(case, path, step, action))
            if kind.check_after == stage:
                errs.extend(kind.check(ctx, path, step, action))
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
            if isinstance(fill, dict) and "same_values" in fill:
                errs.extend(numerics.check_same_values(case, (*epath, tname), tname, fill,
                                                       tensors, object_tensors))
                continue
            try:
                (opargs.check_object_fill if tname in object_tensors else check_fill)(
                    case, (*epath, tname), fill, True)
            except CaseFileErrors as exc:
                errs.extend(exc.errors)
    if errs:
        raise CaseFileErrors(errs)


def _check_keys(case: Case, path: Path, step: dict[str, Any],
                action: str) -> list[CaseFileError]:
    """Keys that belong to other kinds of step, and ``stream: side`` without CUDA tensors."""
    errs: list[CaseFileError] = []
    for key, kinds in ONLY_WITH.items():
        if key in step and action not in kinds:
            article = "an" if action[0] in "aeiou" else "a"
            errs.append(case.error((*path, key),
                                   f"'{key}' does not apply to {article} {action} step",
                                   f"'{key}' belongs to {' / '.join(kinds)} steps"))
    if action == "op" and step.get("stream") == "side" and devices(case) != ["cuda"]:
        errs.append(case.error((*path, "stream"), "'stream: side' needs CUDA tensors",
                               "add 'device: cuda' to the case (it skips without a GPU)"))
    return errs


def _check_outcome(case: Case, path: Path, step: dict[str, Any],
                   action: str) -> list[CaseFileError]:
    """What a step states about its outcome: ``raises``, timeouts and lifecycle values,
    ``returns``, ``warns``, and work_state keys on steps of other kinds."""
    return [*lifecycle.check(case, path, step, action), *returns.check(case, path, step),
            *returns.check_warns(case, path, step),
            *work_state.misplaced(case, path, step, action)]


def _check_repeat_and_ranks(case: Case, path: Path, step: dict[str, Any],
                            action: str) -> list[CaseFileError]:
    """``repeat``/``slices`` against the op's buffers, and the ``ranks`` expression."""
    step_op = ops.ALL_OPS.get(step.get("op", ""))
    errs = repeat.check(case, path, step, action, case.raw.get("tensors", {}),
                        tuple(r.name for r in step_op.roles) if step_op else (),
                        tuple(r.name for r in step_op.roles
                              if r.form in ("list", "nested")) if step_op else ())
    if isinstance(step.get("ranks"), str):
        try:
            check_expr(case, (*path, "ranks"), step["ranks"])
        except CaseFileErrors as exc:
            errs.extend(exc.errors)
    return errs


# The checks every step gets, in the order their problems are listed; a kind's own problems
# come after the stage it names (StepKind.check_after).
COMMON_CHECKS: tuple[tuple[Stage, CommonCheck], ...] = (
    ("keys", _check_keys), ("outcome", _check_outcome), ("last", _check_repeat_and_ranks))


def _check_case_reduce_op(case: Case) -> list[CaseFileError]:
    """A case-level ``reduce_op:`` that no call of the program uses would still name the
    instances (``-max-``) and so claim a reduction that was never checked."""
    if "reduce_op" not in case.raw:
        return []
    reducing = [s for _, s in stepkinds.walk(case.raw["steps"]) if isinstance(s, dict)
                and s.get("op") in ops.ALL_OPS and ops.get(s["op"]).reduces]
    if any("reduce_op" not in s for s in reducing):
        return []
    why = ("every reducing step names its own reduce_op" if reducing
           else "no step of this program reduces")
    return [case.error(("reduce_op",), f"the case's reduce_op is used by no call: {why}",
                       "remove it, or drop reduce_op from the steps that should take the "
                       "case's value")]
