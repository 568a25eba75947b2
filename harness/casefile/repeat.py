"""``repeat``/``slices`` on op steps: one op issued N times (upstream's ``*_stress`` tests).

``repeat: N`` issues the step's op N times in a row; ``rep`` (0..N-1) is available in its
``src``/``dst`` expressions. With ``async`` and a ``handle`` all N Works stay in flight until
the handle is waited (one wait for all, in issue order). ``slices: true`` gives repetition
``rep`` slice ``rep`` (along dim 0) of each of the step's buffers, so N ops in flight work on
N separate tensors; a buffer given as a list of N tensor names instead (``tensor: [t0, t1,
t2]``, for a buffer that takes one tensor) gives repetition ``rep`` the tensor ``t<rep>``, as
upstream's stress tests write ``pg.allreduce(inputs[i])``. A buffer that takes a list of
tensors, given as separately named tensors (``tensors: [a, b]``), passes the list of their
``rep``-th slices, as upstream's coalesced stress tests write
``pg.allreduce_coalesced(inputs[i])`` with ``inputs[i]`` a list of tensors.
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
            errs.extend(_sliced_list(case, (*path, role), name, n, tensors))
            continue
        if isinstance(name, list):
            errs.extend(_per_repetition(case, (*path, role), name, n, tensors))
            continue
        errs.extend(_sliceable(case, (*path, role), (*path, "slices"), name, n, tensors))
    return errs


def _sliceable(case: Case, where: Path, count_at: Path, name: Any, n: int,
               tensors: dict[str, Any]) -> list[CaseFileError]:
    """Problems of slicing tensor ``name`` into ``n`` repetitions (an unknown name is left to
    the buffer checks, which suggest a declared one)."""
    spec = tensors.get(name) if isinstance(name, str) else None
    if spec is None:
        return []
    if spec.get("dtype") == "object" or "entries" in spec:
        return [case.error(where, f"'slices' needs plain tensors; {name} is an object buffer "
                           "or a list of entries")]
    shape = spec.get("shape")
    if shape and isinstance(shape[0], int) and shape[0] != n:
        return [case.error(count_at, f"tensor {name} has {shape[0]} slice(s) along dim 0 but "
                           f"the step repeats {n} time(s)", f"give {name} shape [{n}, ...]")]
    return []


def _sliced_list(case: Case, path: Path, names: list[Any], n: int,
                 tensors: dict[str, Any]) -> list[CaseFileError]:
    """A list buffer given as separately named tensors: each is sliced, so repetition ``rep``
    passes the list of their ``rep``-th slices (``pg.allreduce_coalesced(inputs[rep])``)."""
    errs: list[CaseFileError] = []
    for i, item in enumerate(names):
        inner = list(enumerate(item)) if isinstance(item, list) else [(None, item)]
        for k, name in inner:
            where = (*path, i) if k is None else (*path, i, k)
            if isinstance(name, str) and tensors.get(name, {}).get("dtype") == "object":
                continue  # the list checks say that list entries are tensors
            errs.extend(_sliceable(case, where, where, name, n, tensors))
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
