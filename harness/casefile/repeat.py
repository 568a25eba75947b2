"""``repeat``/``slices`` on op steps: one op issued N times (upstream's ``*_stress`` tests).

``repeat: N`` issues the step's op N times in a row; ``rep`` (0..N-1) is available in its
``src``/``dst`` expressions. With ``async`` and a ``handle`` all N Works stay in flight until
the handle is waited (one wait for all, in issue order). ``slices: true`` gives repetition
``rep`` slice ``rep`` (along dim 0) of each of the step's buffers, so N ops in flight work on
N separate tensors; a buffer given as a list of N tensor names instead (``tensor: [t0, t1,
t2]``, for a buffer that takes one tensor) gives repetition ``rep`` the tensor ``t<rep>``, as
upstream's coalesced stress tests write ``pg.allreduce(inputs[i])``.
"""

from __future__ import annotations

from typing import Any

from ..errors import CaseFileError
from ..model import Case

Path = tuple[Any, ...]
REP_NAME = "rep"


def per_repetition(step: dict[str, Any], form: str) -> bool:
    """Whether a list given for a buffer of ``form`` names one tensor per repetition."""
    return bool(step.get("slices")) and "repeat" in step and form not in ("list", "nested")


def check(case: Case, path: Path, step: dict[str, Any], action: str,
          tensors: dict[str, Any], roles: tuple[str, ...],
          list_roles: tuple[str, ...] = ()) -> list[CaseFileError]:
    """Problems of a step's ``repeat``/``slices`` keys."""
    errs: list[CaseFileError] = []
    for key in ("repeat", "slices"):
        if key in step and action != "op":
            errs.append(case.error((*path, key), f"'{key}' belongs to op steps"))
    if "slices" in step and "repeat" not in step:
        errs.append(case.error((*path, "slices"), "'slices' needs 'repeat: N'",
                               "repetition rep uses slice rep of each buffer"))
    if not step.get("slices") or action != "op" or errs:
        return errs
    n = step["repeat"]
    for role in roles:
        name = step.get(role)
        if isinstance(name, list) and role in list_roles:
            errs.append(case.error((*path, role), "'slices' needs one tensor per buffer, not "
                                   "a list of tensors", f"{role} takes a list of tensors: "
                                   "give one tensor of shape [repeat, ...] per list entry"))
            continue
        if isinstance(name, list):
            errs.extend(_per_repetition(case, (*path, role), name, n, tensors))
            continue
        spec = tensors.get(name) if isinstance(name, str) else None
        if spec is None:
            continue
        if spec.get("dtype") == "object" or "entries" in spec:
            errs.append(case.error((*path, role), f"'slices' needs plain tensors; {name} is "
                                   "an object buffer or a list of entries"))
            continue
        shape = spec.get("shape")
        if shape and isinstance(shape[0], int) and shape[0] != n:
            errs.append(case.error((*path, "slices"), f"tensor {name} has {shape[0]} slice(s) "
                                   f"along dim 0 but the step repeats {n} time(s)",
                                   f"give {name} shape [{n}, ...]"))
    return errs


def _per_repetition(case: Case, path: Path, names: list[Any], n: int,
                    tensors: dict[str, Any]) -> list[CaseFileError]:
    """A list of one tensor name per repetition: N plain tensors the case declares."""
    if len(names) != n:
        return [case.error(path, f"the step repeats {n} time(s) but lists {len(names)} "
                           "tensor(s)", "give one tensor name per repetition")]
    errs: list[CaseFileError] = []
    for i, name in enumerate(names):
        spec = tensors.get(name) if isinstance(name, str) else None
        if spec is None:
            errs.append(case.error((*path, i), f"unknown tensor {str(name)[:60]!r}",
                                   "declare it under 'tensors:'"))
        elif spec.get("dtype") == "object" or "entries" in spec:
            errs.append(case.error((*path, i), f"{name!r} is an object buffer or a list of "
                                   "entries; one repetition takes one plain tensor"))
    return errs


def names(step: dict[str, Any]) -> tuple[str, ...]:
    """Extra expression names a step's src/dst may use."""
    return (REP_NAME,) if "repeat" in step else ()
