"""Every buffer a program's ops write is checked, or declared unchecked with a reason.

A program (the ``steps:`` form) compares only the buffers its ``expected:`` names. A buffer an
op writes and nothing compares would let the program pass whatever the backend put there, and a
property such as ``deterministic`` would have held on nothing. So, at collection, each buffer
that some op step may write (an output or in-place role, an ``irecv`` entry) must be

- given a value under ``expected:`` (``unspecified`` is no value), or
- compared with other buffers by ``same_bits``, or
- named under ``unchecked: {BUFFER: "why its value is not checked"}``;

a case whose own contract is to raise, hang or crash is exempt (its buffers are not its
contract), and so is a step with its own ``raises:``. ``unchecked:`` buffers are still
digested for the numerics properties, so ``deterministic: 3`` with ``unchecked: {out: ...}``
checks that ``out`` comes back bit for bit the same, and nothing more.
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


def check(case: Case) -> list[CaseFileError]:
    """The written buffers of ``case`` that nothing checks, and bad ``unchecked:`` entries."""
    raw = case.raw
    tensors = raw.get("tensors") or {}
    unchecked = raw.get("unchecked") or {}
    given = raw.get("expected")
    expected: dict[str, Any] = given if isinstance(given, dict) else {}
    errs: list[CaseFileError] = []
    for name in unchecked:
        if name not in tensors:
            errs.append(case.error(("unchecked", name), f"unchecked: unknown tensor {name!r}",
                                   suggest(str(name), tuple(tensors))))
        elif name in expected and expected[name] != "unspecified":
            errs.append(case.error(("unchecked", name), f"{name!r} is both unchecked and "
                                   "given a value under expected:", "keep one of the two"))
    if any(k in raw for k in ("raises", "hangs", "crashes")):
        return errs
    same = {n for group in raw.get("same_bits") or [] if isinstance(group, list)
            for n in group}
    for name, (path, op) in written(raw).items():
        valued = name in expected and expected[name] != "unspecified"
        if valued or name in same or name in unchecked or name not in tensors:
            continue
        errs.append(case.error(path, (
            f"buffer {name!r} is written by {op} but nothing checks it, so the program would "
            "pass whatever the backend leaves there"), (
            f"give it a value under expected:, compare it with same_bits, or declare "
            f"unchecked: {{{name}: \"why its value is not checked\"}}")))
    return errs


def check_shorthand(case: Case) -> list[CaseFileError]:
    """The ``op:`` form's output is its contract: ``expected: unspecified`` would leave it
    unchecked (allowed where the case's contract is to raise, hang or crash, and for ops whose
    output every rank must hold identically, which is then what is compared)."""
    raw = case.raw
    if raw.get("expected") != "unspecified" or any(k in raw for k in ("raises", "hangs",
                                                                      "crashes")):
        return []
    op = ops.ALL_OPS.get(str(raw.get("op")))
    if op is not None and op.agree:
        return []  # the ranks' bytes are still compared with each other (evidence: agreement)
    return [case.error(("expected",), "expected: unspecified leaves the op's output unchecked, "
                       "so the case would pass whatever the backend returns",
                       "give the values, or auto (the reference model); to state only that "
                       "the call is accepted, write the program form with unchecked:")]
