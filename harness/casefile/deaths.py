"""Programs that go on after a death: which ranks die where, by design, and what may follow.

A program whose steps kill some of its ranks (``exit``, ``abort``, ``segfault``, ``kill``: a
SIGKILL; ``stall``: the rank stops answering without dying), that does not declare
``crashes: true`` and that asks something of the survivors after the first death (a step's
``raises:``, or a recovery) is a program *through a failure*: the survivors' steps after the
death are run and judged like any other (what their pending or next call raised and how
soon, with ``raises: {within: S}``; the recovery: ``abort_group``, ``reform`` or ``shrink``,
or a group of the survivors made by a ``new_group`` step; the values computed after it). A
step after a death without ``ranks:`` runs on the ranks still alive. :func:`plan` computes,
per instance, each planned death (rank, step, how) and rejects at the step's line what cannot
be: a death on every rank (no survivor to judge), a step whose ``ranks:`` names a rank
already dead, a recovery whose members include a dead rank, a group made after a death that
names a dead rank (a ``new_group`` step's members, split or subgroups, or an op's ``group:``
list unless the step declares ``raises:``: a call that must fail).

``crashes: true`` keeps its meaning: a rank must die, and the others may do anything. A fault
step after which nothing is asked of the survivors documents how a crash is reported: the
death is not planned, and the instance is a ``crash``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..expr import Expr
from ..model import Case, Step

DEATHS = ("abort", "exit", "segfault", "kill", "stall")
SURVIVORS = "survivors"  # {reform: survivors}: the ranks alive when the step comes
RECOVERY = ("reform", "shrink")
# What else a step after a death may ask of the survivors (besides a ``raises:``).
ASKED = (*RECOVERY, "abort_group", "new_group")
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
    if not any(s.raises is not None or s.kind in ASKED for s in steps[first + 1:]):
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
        if dead:
            _check_group(case, path, step, ws, env, runs, dead)
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


def group_ranks(step: Step, ws: int, env: dict[str, Any], runs: list[int]) -> tuple[int, ...]:
    """The ranks a group made by ``step`` covers, as far as collection knows them: a
    ``new_group`` step's members (evaluated on each rank that runs it), split lists or
    subgroups of the world, an op's ``group:`` list; () for anything else."""
    args = dict(step.args)
    if step.kind == "op":
        group = args.get("group")
        return tuple(group) if isinstance(group, tuple) else ()
    if step.kind != "new_group" or "parent" in args:
        return ()  # positions in another group: its members are checked where it is made
    if args["how"] == "members":
        out: list[int] = []
        for r in runs:
            for v in args["members"]:
                try:
                    out.append(int(v({**env, "world_size": ws, "rank": r})
                                   if isinstance(v, Expr) else v))
                except Exception:  # reported by the group checks at its line
                    continue
        return tuple(dict.fromkeys(out))
    if args["how"] == "subgroups":
        return tuple(range(ws))  # new_subgroups covers the whole world
    return tuple(dict.fromkeys(r for lst in args["lists"] for r in lst))


def _check_group(case: Case, path: tuple[Any, ...], step: Step, ws: int, env: dict[str, Any],
                 runs: list[int], dead: dict[int, tuple[int, str]]) -> None:
    """A group made after a death must be of survivors; an op on a list group with a dead
    member may only declare that it raises."""
    if step.kind == "op" and step.raises is not None:
        return
    bad = [r for r in group_ranks(step, ws, env, runs) if r in dead]
    if not bad:
        return
    how = dict(step.args).get("how")
    key = ("group" if step.kind == "op" else "members" if how == "members" else
           "split" if how == "split" else "subgroups")
    r = bad[0]
    raise case.error((*path, key), f"the group names rank {r}, dead since step {dead[r][0]} "
                     f"({dead[r][1]})", "make the group of the survivors only"
                     if step.kind == "new_group" else
                     "name the survivors only, or declare 'raises:' on the step")
