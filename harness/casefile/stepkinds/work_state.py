"""The state of a Work after its op ran: the ``work_state`` step.

A wait that must fail is ``{wait: H, raises: RE}`` (see :mod:`harness.casefile.lifecycle`:
the program goes on, and the case runs on a private pool); then
- ``{work_state: H, is_completed: B, is_success: B, exception: RE}``: what the Work's
  ``is_completed()``, ``is_success()`` and ``exception()`` return at that point; ``exception:
  none`` states that there is none;
- on the same step, what the backend contract suites ask of a Work: ``sequence_number: N``
  (``_get_sequence_number()``, an integer or an expression), ``duration: positive``
  (``_get_duration()`` is a finite number above 0: the collective was timed, see the
  ``enable_timing`` step) and ``future_result: success`` (``get_future_result().wait()`` read
  as a ``WorkResult``: ``success``, ``timeout``, ``comm_error`` or ``unknown``); each of these
  three may instead be ``{raises: RE}``: the call must raise an error matching RE (searched in
  ``"Type: message"``), e.g. ``_get_duration()`` of a Work issued before timing was enabled.
  Give at least one key.

Runs in the pytest process: no torch.
"""

from __future__ import annotations

import re

from ...errors import CaseFileError
from ...model import Case, Step
from .base import BuildContext, CheckContext, Path, RawStep, StepKind
from .pgstate import check_count, count_value

KEYS = ("is_completed", "is_success", "exception", "sequence_number", "duration",
        "future_result")
# The keys whose call may be stated to raise instead (``{raises: RE}``).
MAY_RAISE = ("sequence_number", "duration", "future_result")
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
        for key in MAY_RAISE:
            value = step.get(key)
            if isinstance(value, dict):
                errs.extend(_regex(case, (*path, key, "raises"), value["raises"]))
        if isinstance(step.get("sequence_number"), str):
            errs.extend(check_count(ctx, (*path, "sequence_number"), step["sequence_number"]))
        return errs

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step with the handle it reads and the stated values in args."""
        args = tuple((k, count_value(step[k], ctx.names) if k == "sequence_number"
                      and not isinstance(step[k], dict) else step[k])
                     for k in KEYS if k in step)
        return Step("work_state", ctx.line, ranks=ctx.ranks, waits=(step["work_state"],),
                    args=args)


KIND = WorkStateStep()
