"""Programs that go on after a death: which ranks die where, by design, and what may follow.

A program whose steps kill some of its ranks (``exit``, ``abort``, ``segfault``, ``kill``: a
SIGKILL; ``stall``: the rank stops answering without dying), that does not declare
``crashes: true`` and that asks something of the survivors after the first death (a step's
``raises:``, or a recovery) is a program *through a failure*: the survivors' steps after the
death are run and judged like any other (what their pending or next call raised and how soon, with
``raises: {within: S}``; the recovery, ``reform`` or ``shrink``; the values computed after
it). A step after a death without ``ranks:`` runs on the ranks still alive. :func:`plan`
computes, per instance, each planned death (rank, step, how) and rejects at the step's line
what cannot be: a death on every rank (no survivor to judge), a step whose ``ranks:`` names a
rank already dead, a recovery whose members include a dead rank.

``crashes: true`` keeps its meaning: a rank must die, and the others may do anything. A fault
step after which nothing is asked of the survivors documents how a crash is reported: the
death is not planned, and the instance is a ``crash``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..model import Case, Step

DEATHS = ("abort", "exit", "segfault", "kill", "stall")
SURVIVORS = "survivors"  # {reform: survivors}: the ranks alive when the step comes
RECOVERY = ("reform", "shrink")
Death = tuple[int, int, str]  # rank, step, how ("exit 3", "kill", "stall", ...)


def _how(step: Step) -> str:
    return f"exit {int(step.value)}" if step.kind == "exit" else step.kind


def with_survivors(steps: tuple[Step, ...], ws: int, env: dict[str, Any]) -> tuple[Step, ...]:
    """``{reform: survivors}`` made concrete: the ranks alive when the step comes, in order
    (and the step run on them unless its ``ranks:`` says otherwise)."""
    dead: set[int] = set()
    out: list[Step] = []
    for step in steps:
        if step.kind == "reform" and step.value == SURVIVORS:
            alive = tuple(r for r in range(ws) if r not in dead)
            step = replace(step, value=alive, ranks=alive if step.ranks is None else step.ranks)
        if step.kind in DEATHS:
            dead.update(r for r in range(ws) if step.runs_on(r, ws, env))
        out.append(step)
    return tuple(out)


def members(step: Step, ws: int) -> tuple[int, ...]:
    """The ranks of the world a recovery step leaves (reform: its list; shrink: the rest)."""
    listed = tuple(int(r) for r in step.value)
    return listed if step.kind == "reform" else tuple(r for r in range(ws) if r not in listed)


def plan(case: Case, steps: tuple[Step, ...], ws: int, env: dict[str, Any]) -> tuple[Death, ...]:
    """Every planned death of the instance, in step order (empty for ``crashes: true``);
    CaseFileError at the first step that cannot run as written."""
    if case.raw.get("crashes") or not any(s.kind in DEATHS for s in steps):
        return ()
    first = next(i for i, s in enumerate(steps) if s.kind in DEATHS)
    if not any(s.raises is not None or s.kind in RECOVERY for s in steps[first + 1:]):
        # Nothing is asked of the survivors: a fault documenting how a crash is reported.
        return ()
    dead: dict[int, tuple[int, str]] = {}
    for idx, step in enumerate(steps):
        path = ("steps", idx)
        if step.kind in RECOVERY:
            bad = [r for r in members(step, ws) if r in dead]
            if bad:
                raise case.error((*path, step.kind), f"the group {list(members(step, ws))} "
                                 f"names rank {bad[0]}, dead since step {dead[bad[0]][0]}",
                                 "re-form the world from the survivors only")
        runs = [r for r in range(ws) if step.runs_on(r, ws, env)]
        # A step without ``ranks:`` after a death runs on whoever is left; one that names a
        # dead rank is a mistake.
        gone = [r for r in runs if r in dead] if step.ranks is not None else []
        if gone:
            r = gone[0]
            raise case.error(path, f"rank {r} died at step {dead[r][0]} ({dead[r][1]}) and "
                             f"cannot run step {idx} ({step.kind})",
                             "limit the step to the survivors with 'ranks:'")
        if step.kind in DEATHS:
            for r in runs:
                dead[r] = (idx, _how(step))
            if len(dead) == ws:
                raise case.error(path, f"every rank of the world of {ws} dies: no survivor "
                                 "is left to judge", "limit the fault step with 'ranks:', or "
                                 "declare 'crashes: true' to test a crash alone")
    return tuple(sorted(((r, i, how) for r, (i, how) in dead.items()), key=lambda d: d[1:]))
