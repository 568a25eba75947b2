"""``scramble: SEED``: each rank issues and waits a program's async work in its own order.

oneCCL's tests randomise each rank's start and completion order; a backend that matches work
across ranks by issue order, or completes it only in issue order, fails there. What the
contract allows is reordered, nothing else:

* a run of consecutive async op steps (each with a ``handle``, on every rank) on pairwise
  different groups (the world, a rank list, a group a ``new_group`` step made): collectives
  on one group must be issued in the same order everywhere, so a repeated group ends the run;
* a run of consecutive ``wait`` steps on every rank, and the handles of each ``wait`` step:
  waiting is local, in any order.

Each rank's order is a permutation drawn from the seed and the rank (the same on every run):
the run becomes one copy per rank (``ranks: [r]``) in that rank's order, so step indices in
messages count the copies. Runs at collection (no torch).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from ..model import Case, Step


def _group_key(step: Step) -> Any:
    group = dict(step.args).get("group")
    return tuple(group) if isinstance(group, list) else group


def _issuable(step: Step) -> bool:
    return (step.kind == "op" and step.async_op and step.handle is not None
            and step.ranks is None and step.repeat == 1)


def _runs(steps: tuple[Step, ...]) -> list[tuple[int, int]]:
    """(start, end) of each run of reorderable steps (two or more)."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(steps):
        j = i
        if _issuable(steps[i]):
            seen = {_group_key(steps[i])}
            j = i + 1
            while j < len(steps) and _issuable(steps[j]) and _group_key(steps[j]) not in seen:
                seen.add(_group_key(steps[j]))
                j += 1
        elif steps[i].kind == "wait" and steps[i].ranks is None:
            j = i + 1
            while j < len(steps) and steps[j].kind == "wait" and steps[j].ranks is None:
                j += 1
        if j - i >= 2 or (j > i and steps[i].kind == "wait" and len(steps[i].waits) > 1):
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def apply(case: Case, steps: tuple[Step, ...], world_size: int, seed: int) -> tuple[Step, ...]:
    """``steps`` with every reorderable run replaced by one copy per rank in its own order."""
    if "op" in case.raw:
        raise case.error(("scramble",), "scramble reorders a program's async steps per rank; "
                         "the op: form has one step", "write the case as a steps: program "
                         "with several async ops on different groups, or remove scramble")
    out: list[Step] = []
    last = 0
    for start, end in _runs(steps):
        out.extend(steps[last:start])
        for rank in range(world_size):
            rng = random.Random(seed * 1_000_003 + rank * 7919 + start)
            mine = list(steps[start:end])
            rng.shuffle(mine)
            out.extend(replace(s, ranks=(rank,), waits=tuple(rng.sample(s.waits, len(s.waits))))
                       if s.kind == "wait" else replace(s, ranks=(rank,)) for s in mine)
        last = end
    out.extend(steps[last:])
    return tuple(out)
