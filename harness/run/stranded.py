"""When a rank raised, whether the ranks still running can never finish: ends the wait early.

After one rank raises, the pool gives the others a grace period to finish or raise too, then
diagnoses the ones still blocked. Waiting out the whole grace costs seconds per instance (most
of the bundled suite's time once went there), but cutting it short must never change what is
recorded: a rank that would have raised a moment later must not be reported as blocked. So the
wait ends early only where the program's shape proves the blocked ranks are stranded:

* every step of the program is a plain op or wait step, run by every rank or by none, on
  the default group, synchronous, with no timeout of its own and no declared ``raises:``
  (so no rank can have posted work that a later call could match, and no rank is about to
  time out);
* every still-running rank is inside a collective (not a point-to-point call) at a step index
  at or after the step every raised rank stopped at;
* every still-running rank's process is asleep and has used no CPU time (no thread of it: the
  backend's worker threads included) for :data:`SETTLE_S`, with its step unchanged: it is
  waiting, not still on its way into the call (a rank that is about to raise its own error is
  running, or runnable under load, and so keeps the full grace). What the rank started counts
  as the rank: a backend's worker process that is still running keeps the grace too.

Then each blocked rank waits for a call that a raised rank has not made and never will (it left
the program), and only the process group's own timeout could end the wait; ``--pg-timeout``
and a case's ``pg_timeout:`` shorter than a minute keep the full grace. Where ``/proc`` cannot
be read the full grace is kept.

Must not: guess from elapsed time alone, or apply to programs with subgroups, rank-restricted
steps, async work, timeouts or declared step errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import ops
from ..expr import Expr
from ..model import Instance, RankResult, Step, flat_steps

SETTLE_S = 0.2
# Processes under one rank looked at (a backend's workers); more are not read.
MOST_DESCENDANTS = 64
# A process group timeout at least this long cannot fire inside the grace period.
LONG_TIMEOUT_S = 60.0
# Arguments that give a call a deadline of its own.
TIMEOUT_ARGS = frozenset({"timeout", "group_timeout", "set_timeout"})


def eligible(inst: Instance, pg_timeout_s: float) -> bool:
    """Whether ``inst``'s program has the shape that lets a stranded rank be recognised."""
    timeout = inst.pg_timeout if inst.pg_timeout is not None else pg_timeout_s
    if timeout < LONG_TIMEOUT_S:
        return False
    for step in flat_steps(inst.steps):
        if step.kind == "wait":
            continue
        if step.kind != "op" or step.op is None or not _every_rank_or_none(step):
            return False
        if step.raises is not None or step.async_op or step.op in ops.ALWAYS_ASYNC:
            return False
        names = {k for k, _ in step.args}
        if "group" in names or names & TIMEOUT_ARGS:
            return False
    return True


def _every_rank_or_none(step: Step) -> bool:
    """A step without ``ranks:``, or whose ``ranks:`` expression does not read ``rank`` (such
    as ``which == 0``): every rank runs it, or none does."""
    return step.ranks is None or (isinstance(step.ranks, Expr) and "rank" not in
                                  step.ranks.names)


def stranded(inst: Instance, raised: Mapping[int, RankResult],
             steps_of_pending: Mapping[int, int]) -> bool:
    """Whether every pending rank waits in a collective no raised rank can join any more.

    ``steps_of_pending`` maps each still-running rank to the step index it is in (its
    progress slot); ``raised`` holds the results of the ranks that raised. Call only for an
    :func:`eligible` instance.
    """
    if not raised or not steps_of_pending:
        return False
    if any(r.in_flight for r in raised.values()):
        return False
    stopped_at = max(r.step for r in raised.values())
    for idx in steps_of_pending.values():
        if not 0 <= idx < len(inst.steps) or idx < stopped_at:
            return False
        step = inst.steps[idx]
        if step.kind != "op" or step.op is None or ops.get(step.op).point_to_point:
            return False
    return True


def _stat(pid: int) -> tuple[str, int] | None:
    """(state of the main thread, CPU clock ticks of all threads) of one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    if len(fields) < 13 or not fields[11].isdigit() or not fields[12].isdigit():
        return None
    return fields[0], int(fields[11]) + int(fields[12])


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started and theirs (at most :data:`MOST_DESCENDANTS`), from the
    ``children`` lists of their threads; those that cannot be read are left out."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < MOST_DESCENDANTS:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as fh:
                    kids = [int(k) for k in fh.read(65536).split() if k.isdigit()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found[:MOST_DESCENDANTS]


def process_activity(pid: int) -> tuple[str, int] | None:
    """(state, CPU clock ticks) of rank ``pid`` from ``/proc``, counting what the rank started:
    a backend may run its collectives in a worker process (torchft's BabyGloo), where a rank
    that is about to raise does its work while the rank itself sleeps on a pipe. The state is
    the rank's main thread's unless a descendant is running or in uninterruptible sleep (then
    that one's); the ticks are summed over the rank's threads and its descendants'. None when
    the rank cannot be read (another OS, the process gone)."""
    own = _stat(pid)
    if own is None:
        return None
    state, ticks = own
    for child in _descendants(pid):
        act = _stat(child)
        if act is None:
            continue  # ended meanwhile: the sum changes, which keeps the grace
        ticks += act[1]
        if act[0] in ("R", "D"):
            state = act[0]
    return state, ticks


@dataclass
class StrandWatch:
    """Watches the pending ranks of an :func:`eligible` instance after a rank raised; says when
    they have been stranded, asleep and idle, for :data:`SETTLE_S`."""

    inst: Instance
    seen: dict[int, tuple[int, str, int]] = field(default_factory=dict)
    since: float = 0.0

    def settled(self, now: float, raised: Mapping[int, RankResult],
                steps_of_pending: Mapping[int, int], pids: Mapping[int, int]) -> bool:
        if not stranded(self.inst, raised, steps_of_pending):
            self.seen = {}
            return False
        snap: dict[int, tuple[int, str, int]] = {}
        for r, idx in steps_of_pending.items():
            act = process_activity(pids[r])
            if act is None or act[0] != "S":
                self.seen = {}
                return False
            snap[r] = (idx, *act)
        if snap != self.seen:
            self.seen, self.since = snap, now
            return False
        return now - self.since >= SETTLE_S
