"""What a program compares, known before it runs: nothing passes on nothing.

A program (the ``steps:`` form) compares the buffers its ``expected:`` gives values (any fill
but ``unspecified``), the groups of ``same_bits``, and whatever its steps state (``returns``,
``warns``, a step's ``raises``, ``work_state``, ``blocks_until_all``, a read's or future's
``expect``, the membership a ``new_group`` step checks, ``call_returns`` and the API-contract
steps ``seq_number``, ``work_registry``, ``current_device``, ``stream_idle``); the numerics
properties compare the bits of every buffer across runs; a declared tensor no op writes must
come back untouched; an op that takes no buffer (``barrier``) is observed returning. A program
with none of these would pass whatever the backend did, so it is a collection error at the
step that writes its first unchecked buffer (or at ``steps:``).

A buffer that some op writes and nothing compares is allowed next to other evidence, but it
is never silent: it is listed on the instance (:func:`unchecked`) and in the record's
``not_checked``, with the case's reason when ``unchecked: {BUFFER: "why"}`` gives one. A case
whose own contract is to raise, hang or crash is exempt (its buffers are not its contract),
and so is a step with its own ``raises:``.
"""

from __future__ import annotations

from typing import Any

from .. import ops
from ..errors import CaseFileError
from ..model import Case
from .fields import suggest
from .stepkinds.cuda import walk

Path = tuple[Any, ...]


def _names(value: Any) -> list[str]:
    """Tensor names in a role's value: a name, a list of names, or a list of lists."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [n for v in value for n in _names(v)]
    return []


def written(raw: dict[str, Any]) -> dict[str, tuple[Path, str]]:
    """Buffer -> (the path of its first writing step's key, the op) for every op step."""
    out: dict[str, tuple[Path, str]] = {}
    for path, step in walk(raw.get("steps") or []):
        if not isinstance(step, dict) or step.get("op") not in ops.ALL_OPS or "raises" in step:
            continue  # a step that must raise writes nothing the case could expect
        op = ops.get(step["op"])
        for role in op.roles:
            if role.access != "in" and role.name in step:
                for name in _names(step[role.name]):
                    out.setdefault(name, ((*path, role.name), op.name))
        for k, entry in enumerate(step.get("p2p") or []):
            if isinstance(entry, dict) and entry.get("op") == "irecv":
                for name in _names(entry.get("tensor")):
                    out.setdefault(name, ((*path, "p2p", k, "tensor"), op.name))
    return out


STEP_CHECKS = ("returns", "warns", "raises", "work_state", "blocks_until_all", "new_group",
               "call_returns", "seq_number", "work_registry", "current_device", "stream_idle",
               "identity")


def _valued(raw: dict[str, Any]) -> set[str]:
    """Buffers with a value, and those another buffer is compared with (``same_values``)."""
    given = raw.get("expected")
    expected: dict[str, Any] = given if isinstance(given, dict) else {}
    return {str(n) for n, v in expected.items() if v != "unspecified"} | {
        str(v["same_values"]) for v in expected.values()
        if isinstance(v, dict) and "same_values" in v}


def _same_bits(raw: dict[str, Any]) -> set[str]:
    return {str(n) for group in raw.get("same_bits") or [] if isinstance(group, list)
            for n in group}


def declares_failure(raw: dict[str, Any]) -> bool:
    """Whether the case's own contract is to raise, hang or crash (``hangs: false`` is not)."""
    return any(raw.get(k) for k in ("raises", "hangs", "crashes"))


def unchecked(raw: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """(buffer, the case's reason or "") for each buffer an op writes that nothing compares."""
    if "steps" not in raw or declares_failure(raw):
        return ()  # the contract is the failure mode, not the buffers
    reasons = raw.get("unchecked") or {}
    left = set(written(raw)) - _valued(raw) - _same_bits(raw)
    return tuple((n, str(reasons.get(n, ""))) for n in sorted(left))


def _compares_something(raw: dict[str, Any], writes: set[str]) -> bool:
    """Whether anything of the program is compared (see the module docstring)."""
    tensors = raw.get("tensors") or {}
    if _valued(raw) or _same_bits(raw) or set(tensors) - writes:
        return True  # a value, a same_bits group, or a buffer that must come back untouched
    if any(raw.get(k) for k in ("deterministic", "iterations", "offset_invariant",
                                "fusion_invariant", "size_invariant")):
        return True
    for _, step in walk(raw.get("steps") or []):
        if not isinstance(step, dict):
            continue
        if any(k in step for k in STEP_CHECKS):
            return True
        if ("read" in step or "future" in step) and step.get("expect", "unspecified") != (
                "unspecified"):
            return True
        op = ops.ALL_OPS.get(str(step.get("op")))
        if op is not None and op.takes_no_buffer:
            return True  # barrier-like: its return on every rank is observed
    return False


def check(case: Case) -> list[CaseFileError]:
    """Bad ``unchecked:`` entries, and a program that would compare nothing at all."""
    raw = case.raw
    tensors = raw.get("tensors") or {}
    reasons = raw.get("unchecked") or {}
    valued = _valued(raw)
    errs: list[CaseFileError] = []
    for name in reasons:
        if name not in tensors:
            errs.append(case.error(("unchecked", name), f"unchecked: unknown tensor {name!r}",
                                   suggest(str(name), tuple(tensors))))
        elif name in valued:
            errs.append(case.error(("unchecked", name), f"{name!r} is both unchecked and "
                                   "given a value under expected:", "keep one of the two"))
    if errs or declares_failure(raw):
        return errs
    writes = written(raw)
    if _compares_something(raw, set(writes)):
        return []
    left = [(n, w) for n, w in writes.items() if n in tensors]
    path, what = ((left[0][1][0], f"buffer {left[0][0]!r} is written by {left[0][1][1]} but "
                   "nothing checks it, and nothing else in the program is compared")
                  if left else (("steps",), "nothing in this program is compared"))
    return [case.error(path, f"{what}, so it would pass whatever the backend does", (
        "give a buffer a value under expected:, compare buffers with same_bits, or state "
        "what a step must do (returns, raises, work_state, a read's expect)"))]


def check_shorthand(case: Case) -> list[CaseFileError]:
    """The ``op:`` form's output is its contract: ``expected: unspecified`` would leave it
    unchecked (allowed where the case's contract is to raise, hang or crash, and for ops whose
    output every rank must hold identically, which is then what is compared)."""
    raw = case.raw
    if raw.get("expected") != "unspecified" or declares_failure(raw):
        return []
    op = ops.ALL_OPS.get(str(raw.get("op")))
    if op is not None and op.agree:
        return []  # the ranks' bytes are still compared with each other (evidence: agreement)
    return [case.error(("expected",), "expected: unspecified leaves the op's output unchecked, "
                       "so the case would pass whatever the backend returns",
                       "give the values, or auto (the reference model); to state only that "
                       "the call is accepted, write the program form with unchecked:")]
