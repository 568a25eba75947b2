"""Case-format side of timeouts, expected step errors and process-group lifecycle.

Keys and steps (docs/reference/environment.md):

- ``raises: RE`` or ``raises: {match: RE, not_before: S, within: W, type: [T, ...]}`` on an
  op, wait, ``set_timeout`` or ``destroy`` step: the step must raise a matching error (no
  earlier than S and no later than W seconds after it was entered; of class T or a subclass
  of it, as ``assertRaises((T, ...))`` accepts; ``type`` alone leaves the message free), and
  the program goes on, so a later step can show what the error left behind;
- ``group_timeout: S`` beside ``group:``: the subgroup is made with ``new_group(ranks,
  timeout=S)``;
- ``blocks_until_all: true`` on a barrier step: no rank sees the barrier complete before the
  last rank entered it (judged across ranks, see :mod:`harness.verdict.steps`);
- ``{set_timeout: S}`` (with ``group:`` for a subgroup): ``ProcessGroup.set_timeout``;
- ``{destroy: true}`` (with ``group:`` for a subgroup): ``destroy_process_group``;
- ``{abort_group: true}`` (with ``group:`` for a subgroup): torch's
  ``distributed_c10d._abort_process_group`` (the world: every group, as
  ``destroy_process_group()`` does), a recovery step after a death (``docs/reference/
  programs.md#through-a-failure``).

A program with a step-level ``raises``, a ``set_timeout``, a ``destroy`` or an
``abort_group`` runs on a private rank pool that is closed after it: an expected error may
leave a communicator broken (Gloo closes the pairs of a timed-out group), a timeout set on a
pooled group would leak into later instances, and a destroyed or aborted group must never be
handed to another instance.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import CaseFileError, quote
from ..model import Case
from . import patterns

LIFECYCLE_ACTIONS = ("set_timeout", "destroy", "abort_group")
# Ops whose contract is "no rank leaves before every rank arrived".
BARRIER_OPS = ("barrier", "monitored_barrier")
# An exception class name as Python spells it (``RuntimeError``, ``DistBackendError``).
CLASS_NAME = re.compile(r"[A-Za-z_]\w{0,99}\Z")


def raises_types(raw: Any) -> tuple[str, ...]:
    """The class names of a ``raises:`` mapping's ``type`` (a name or a list of names)."""
    value = raw.get("type", ()) if isinstance(raw, dict) else ()
    return (value,) if isinstance(value, str) else tuple(value)


def _seconds(case: Case, path: tuple[Any, ...], value: Any, what: str) -> list[CaseFileError]:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []  # the schema reports the type
    if not math.isfinite(value) or value <= 0:
        return [case.error(path, f"{what} must be a positive, finite number of seconds, got "
                           f"{value!r}")]
    return []


def check(case: Case, path: tuple[Any, ...], step: dict[str, Any],
          action: str) -> list[CaseFileError]:
    """Problems of one step's timeout, error and lifecycle keys."""
    errs: list[CaseFileError] = []
    if "group_timeout" in step:
        if "group" not in step:
            errs.append(case.error((*path, "group_timeout"), "'group_timeout' needs 'group:'",
                                   "the world group's timeout is the case's 'pg_timeout:'"))
        errs += _seconds(case, (*path, "group_timeout"), step["group_timeout"], "group_timeout")
    if "set_timeout" in step:
        errs += _seconds(case, (*path, "set_timeout"), step["set_timeout"], "set_timeout")
    if step.get("blocks_until_all") and action == "op" and step.get("op") not in BARRIER_OPS:
        errs.append(case.error((*path, "blocks_until_all"),
                               f"'blocks_until_all' is the contract of a barrier, not of "
                               f"{quote(str(step.get('op')))}",
                               "use it on a barrier or monitored_barrier step"))
    if step.get("blocks_until_all") and step.get("repeat", 1) != 1:
        errs.append(case.error((*path, "blocks_until_all"),
                               "'blocks_until_all' times one call; it cannot be repeated",
                               "drop 'repeat:' or write the barrier steps out"))
    raw = step.get("raises")
    if raw is not None:
        match = raw.get("match") if isinstance(raw, dict) else raw
        if isinstance(match, str):
            try:
                patterns.compile_pattern(match)
            except patterns.PatternError as exc:
                sub = ("raises", "match") if isinstance(raw, dict) else ("raises",)
                errs.append(case.error((*path, *sub), f"bad pattern {quote(match)}: {exc}"))
        for k, name in enumerate(raises_types(raw)):
            if not CLASS_NAME.match(name):
                where: tuple[Any, ...] = (("raises", "type", k) if isinstance(raw["type"], list)
                                          else ("raises", "type"))
                errs.append(case.error((*path, *where), f"{quote(name)} is not an exception "
                                       "class name", "e.g. type: [RuntimeError, ValueError]"))
        if isinstance(raw, dict) and "not_before" in raw:
            errs += _seconds(case, (*path, "raises", "not_before"), raw["not_before"],
                             "not_before")
        if isinstance(raw, dict) and "within" in raw:
            errs += _seconds(case, (*path, "raises", "within"), raw["within"], "within")
            if isinstance(raw.get("not_before"), int | float) and isinstance(
                    raw["within"], int | float) and raw["within"] <= raw["not_before"]:
                errs.append(case.error((*path, "raises", "within"), f"within {raw['within']!r}"
                                       f" is not after not_before {raw['not_before']!r}",
                                       "the window [not_before, within] must not be empty"))
        if step.get("repeat", 1) != 1:
            errs.append(case.error((*path, "raises"), "a step that must raise cannot be "
                                   "repeated", "drop 'repeat:'"))
        if action == "wait" and isinstance(step.get("wait"), list) and len(step["wait"]) != 1:
            errs.append(case.error((*path, "raises"), "a wait that must raise waits one handle",
                                   "split it: one wait step per handle"))
        if step.get("thread"):
            errs.append(case.error((*path, "raises"), "a wait that must raise cannot run in "
                                   "another thread", "drop 'thread: true'"))
    return errs


def step_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The :class:`~harness.model.Step` fields for a step's ``raises`` and
    ``blocks_until_all`` (validated already)."""
    out: dict[str, Any] = {}
    r = raw.get("raises")
    if r is not None:
        out["raises"] = r.get("match", "") if isinstance(r, dict) else r
        if raises_types(r):
            out["raises_types"] = raises_types(r)
        if isinstance(r, dict) and "not_before" in r:
            out["raises_not_before"] = float(r["not_before"])
        if isinstance(r, dict) and "within" in r:
            out["raises_within"] = float(r["within"])
    if raw.get("blocks_until_all"):
        out["blocks_until_all"] = True
    return out


# Steps that leave state behind in the rank's process groups: a Work left in flight
# (``drop``), a sequence number that counts from the group's start, timing switched on.
STATEFUL_ACTIONS = ("drop", "seq_number", "enable_timing")


def needs_private_pool(steps: list[Any]) -> bool:
    """Whether a program must run on a private pool (see the module docstring, and
    :data:`STATEFUL_ACTIONS`)."""
    return any(isinstance(s, dict) and ("raises" in s or any(
        a in s for a in (*LIFECYCLE_ACTIONS, *STATEFUL_ACTIONS, "reform", "shrink")))
               for s in steps)
