"""Packing instances onto the ranks a launcher gave: rounds of disjoint subgroups.

External-ranks mode (:mod:`harness.external`) runs every instance whose world size fits
in the launched world. An instance of world size ``k`` runs on a block of ``k`` consecutive
global ranks (launchers number a node's ranks consecutively, so a block stays on as few nodes
as it can); blocks of one *round* are disjoint, so their instances run at the same time, and
a round ends when all of them have finished. Ranks outside every block of a round go on to the
round's end and wait there.

Some instances cannot share the world with others:

- programs with subgroups of their own (``group:`` arguments): ``new_group`` is collective
  over the whole launched world, so every rank must take part, in the same order; and
  programs that omit a root (``omit: [dst]``): torch's default is global rank 0;
- instances that must hang, crash or may poison the process group (``hangs``, ``crashes``,
  ``isolate``): they end with the launcher restarting every rank, so they run alone, after
  everything else.

The schedule is a pure function of the instance list and the world size, so every rank
computes the same one without talking to the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..model import Instance, flat_steps

# Why an instance runs alone (the round's ``alone`` value).
ALONE_GROUPS = "subgroups"  # its program creates subgroups: every rank calls new_group
ALONE_RESTART = "restart"  # it hangs, crashes or poisons the group: the ranks restart after


@dataclass(frozen=True)
class Slot:
    """One instance placed on global ranks ``members`` (instance rank i = members[i])."""

    index: int  # position in the instance list
    members: tuple[int, ...]


@dataclass(frozen=True)
class Round:
    """Instances that run at the same time on disjoint blocks of ranks."""

    slots: tuple[Slot, ...]
    alone: str = ""  # "", ALONE_GROUPS or ALONE_RESTART

    def blocks(self) -> list[tuple[int, ...]]:
        """The rank blocks of this round, in slot order (the order subgroups are made in)."""
        return [s.members for s in self.slots]


def alone_reason(inst: Instance) -> str:
    """Why ``inst`` must have the launched world to itself, or ""."""
    if inst.isolate or inst.expectation.kind in ("hangs", "crashes"):
        return ALONE_RESTART
    if any(dict(s.args).get("group") is not None for s in flat_steps(inst.steps)):
        return ALONE_GROUPS
    # An omitted root is torch's default, global rank 0: the instance's rank 0 only in a
    # block that starts there.
    if any("omit" in dict(s.args) for s in inst.steps):
        return ALONE_GROUPS
    return ""


def plan(instances: Sequence[Instance], world: int, runnable: Sequence[bool],
         pack: bool = True) -> list[Round]:
    """Rounds covering every runnable instance once.

    Instances keep their order within each kind; packing fills a round from rank 0 upward
    with the next instances that fit (first fit over the waiting ones, so one big instance
    does not leave a round mostly empty). ``pack=False`` gives one instance per round, for
    measuring what packing gains.
    """
    normal: list[int] = []
    alone: list[tuple[int, str]] = []
    for i, inst in enumerate(instances):
        if not runnable[i] or inst.world_size > world:
            continue
        why = alone_reason(inst)
        if why:
            alone.append((i, why))
        else:
            normal.append(i)
    rounds: list[Round] = []
    waiting = list(normal)
    while waiting:
        slots: list[Slot] = []
        free = 0
        rest: list[int] = []
        for i in waiting:
            k = instances[i].world_size
            if free + k <= world and (pack or not slots):
                slots.append(Slot(i, tuple(range(free, free + k))))
                free += k
            else:
                rest.append(i)
        rounds.append(Round(tuple(slots)))
        waiting = rest
    # Subgroup programs first, restart-ending ones last: each restart costs a relaunch.
    for why in (ALONE_GROUPS, ALONE_RESTART):
        for i, w in alone:
            if w == why:
                rounds.append(Round((Slot(i, tuple(range(instances[i].world_size))),), why))
    return rounds


def fingerprint(instances: Sequence[Instance], world: int, rounds: Sequence[Round]) -> str:
    """A short digest of what a run will do, so a resumed run knows it is the same run."""
    h = hashlib.sha256(f"{world}\n".encode())
    for inst in instances:
        h.update(f"{inst.key}\n".encode())
    for r in rounds:
        h.update(repr([(s.index, s.members) for s in r.slots]).encode())
    return h.hexdigest()[:16]
