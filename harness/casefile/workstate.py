"""The state of a Work after its op ran: the ``work_state`` step.

A wait that must fail is ``{wait: H, raises: RE}`` (see :mod:`harness.casefile.lifecycle`:
the program goes on, and the case runs on a private pool); then
- ``{work_state: H, is_completed: B, is_success: B, exception: RE}``: what the Work's
  ``is_completed()``, ``is_success()`` and ``exception()`` return at that point; ``exception:
  none`` states that there is none. Give at least one of the three.

Runs in the pytest process: no torch.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import CaseFileError
from ..expr import Expr
from ..model import Case, Step

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
    """Problems of ``work_state`` and its keys in one step."""
    errs: list[CaseFileError] = []
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


def make_step(raw: dict[str, Any], line: int, ranks: tuple[int, ...] | Expr | None) -> Step:
    """The :class:`Step` of a validated ``work_state`` step (the stated values in args)."""
    return Step("work_state", line, ranks=ranks, waits=(raw["work_state"],),
                args=tuple((k, raw[k]) for k in KEYS if k in raw))
