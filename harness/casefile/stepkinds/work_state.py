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

from ...errors import CaseFileError
from ...model import Case, Step
from .base import BuildContext, CheckContext, Path, RawStep, StepKind

KEYS = ("is_completed", "is_success", "exception")
NO_EXCEPTION = "none"


def _regex(case: Case, path: Path, value: str) -> list[CaseFileError]:
    try:
        re.compile(value)
    except re.error as exc:
        return [case.error(path, f"bad regular expression {value!r}: {exc}")]
    return []


def misplaced(case: Case, path: Path, step: RawStep, action: str) -> list[CaseFileError]:
    """The work_state keys on a step of another kind (one of the checks every step gets)."""
    if action == "work_state":
        return []
    return [case.error((*path, key), f"'{key}' belongs to work_state steps",
                       "{work_state: h, " + key + ": ...}") for key in KEYS if key in step]


class WorkStateStep(StepKind):
    """``{work_state: H, ...}``; its problems come after the outcome keys' (raises,
    returns, warns), before repeat's and ranks'."""

    actions = ("work_state",)
    check_after = "outcome"

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """An earlier op step's handle, at least one stated value, a valid exception regex."""
        case = ctx.case
        errs: list[CaseFileError] = []
        if step["work_state"] not in ctx.handles:
            errs.append(case.error((*path, "work_state"), f"no earlier step has handle "
                                   f"{step['work_state']!r}", "give the async op 'handle: NAME'"))
        if not any(k in step for k in KEYS):
            errs.append(case.error(path, "a work_state step states at least one of: "
                                   + ", ".join(KEYS), "e.g. {work_state: h, is_success: false}"))
        if "exception" in step and step["exception"] != NO_EXCEPTION:
            errs.extend(_regex(case, (*path, "exception"), step["exception"]))
        return errs

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step with the handle it reads and the stated values in args."""
        return Step("work_state", ctx.line, ranks=ctx.ranks, waits=(step["work_state"],),
                    args=tuple((k, step[k]) for k in KEYS if k in step))


KIND = WorkStateStep()
