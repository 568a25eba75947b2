"""The state of a Work after its op ran: ``fails:`` on a wait and the ``work_state`` step.

- ``{wait: H, fails: RE}``: the wait must raise an error matching RE (searched in
  ``"ExcType: message"``); the rank's program goes on (a missing raise is a failed check).
- ``{work_state: H, is_completed: B, is_success: B, exception: RE}``: what the Work's
  ``is_completed()``, ``is_success()`` and ``exception()`` return at that point; ``exception:
  none`` states that there is none. Give at least one of the three.

A case with ``fails:`` runs in a private process group (``isolate``): an op that failed may
leave the group unusable for the next instance. Runs in the pytest process: no torch.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import CaseFileError
from ..expr import Expr
from ..model import Case, Step
from .fields import as_list

KEYS = ("is_completed", "is_success", "exception")
NO_EXCEPTION = "none"
Path = tuple[Any, ...]


def _regex(case: Case, path: Path, value: str) -> list[CaseFileError]:
    try:
        re.compile(value)
    except re.error as exc:
        return [case.error(path, f"bad regular expression {value!r}: {exc}")]
    return []


def check(case: Case, path: Path, step: dict[str, Any], action: str,
          handles: set[str]) -> list[CaseFileError]:
    """Problems of ``fails``, ``work_state`` and its keys in one step."""
    errs: list[CaseFileError] = []
    if "fails" in step:
        if action != "wait":
            errs.append(case.error((*path, "fails"), "'fails' belongs to wait steps",
                                   "{wait: h, fails: REGEX}"))
        else:
            errs.extend(_regex(case, (*path, "fails"), step["fails"]))
            if len(as_list(step["wait"])) != 1:
                errs.append(case.error((*path, "wait"), "a wait with 'fails' waits one handle",
                                       "split it into one wait step per handle"))
    for key in KEYS:
        if key in step and action != "work_state":
            errs.append(case.error((*path, key), f"'{key}' belongs to work_state steps",
                                   "{work_state: h, " + key + ": ...}"))
    if action != "work_state":
        return errs
    if step["work_state"] not in handles:
        errs.append(case.error((*path, "work_state"), f"no earlier step has handle "
                               f"{step['work_state']!r}", "give the async op 'handle: NAME'"))
    if not any(k in step for k in KEYS):
        errs.append(case.error(path, "a work_state step states at least one of: "
                               + ", ".join(KEYS), "e.g. {work_state: h, is_success: false}"))
    if "exception" in step and step["exception"] != NO_EXCEPTION:
        errs.extend(_regex(case, (*path, "exception"), step["exception"]))
    return errs


def isolates(raw: dict[str, Any]) -> bool:
    """Whether the case has a wait that must fail (it then runs in a private group)."""
    return any(isinstance(s, dict) and "fails" in s for s in raw.get("steps", []))


def make_step(raw: dict[str, Any], line: int, ranks: tuple[int, ...] | Expr | None) -> Step:
    """The :class:`Step` of a validated ``work_state`` step (the stated values in args)."""
    return Step("work_state", line, ranks=ranks, waits=(raw["work_state"],),
                args=tuple((k, raw[k]) for k in KEYS if k in raw))
