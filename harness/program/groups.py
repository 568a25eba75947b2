"""Rank side of ``new_group`` steps: call torch's group constructor, check what it returned.

Each step calls ``new_group``, ``new_subgroups``, ``new_subgroups_by_enumeration`` or
``split_group`` as the case says and keeps the result under the step's name for later op
steps (``group: NAME``). What torch returned is checked against the membership the case
implies, as a check of its own (``group 'NAME' (step N)``): on a member, a process group whose
global ranks (``get_process_group_ranks``) are the expected members in the expected order and
in which this rank has the expected position; on a non-member, the value torch documents for
that constructor (``GroupMember.NON_GROUP_MEMBER`` from ``new_group``, ``None`` from
``new_group(use_local_synchronization=True)``, ``new_subgroups*`` and ``split_group``). The
harness uses the expected membership for its own bookkeeping (group positions, root-only
buffers), so a constructor that built another group shows as this failed check.

Runs inside rank processes (imports torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ..expr import Expr
from ..model import Step, TensorCheck


@dataclass(frozen=True)
class Named:
    """A group a step made on this rank.

    ``pg`` is what torch returned; ``order`` the group's members (instance ranks, in group
    order) as the case implies them, also known on a non-member of a ``members:`` group;
    ``member`` whether this rank belongs to it.
    """

    pg: Any
    order: tuple[int, ...]
    member: bool
    how: str


def _int(value: Any, scope: dict[str, Any]) -> int:
    return int(value(scope)) if isinstance(value, Expr) else int(value)


def _global(renv: Any, rank: int) -> int:
    """The global rank torch wants; a rank outside the instance's world is passed unchanged
    so that torch, not the harness, rejects it."""
    return int(renv.to_global(rank)) if 0 <= rank < renv.world_size else rank


def create(step: Step, idx: int, renv: Any, env: dict[str, Any],
           named: dict[str, Named]) -> TensorCheck:
    """Run the constructor of ``step`` on this rank, keep the group, return its check."""
    args = dict(step.args)
    how = str(args["how"])
    scope = {**env, "rank": renv.rank, "world_size": renv.world_size}
    parent = named[args["parent"]] if "parent" in args else None
    base = parent.order if parent is not None else tuple(range(renv.world_size))
    expect_none = how != "members" or bool(args.get("use_local_synchronization"))
    count: int | None = None
    want_count: int | None = None
    order: tuple[int, ...] = ()
    if how == "members":
        members = [_int(v, scope) for v in args["members"]]
        kw = {k: args[k] for k in ("sort_ranks", "use_local_synchronization", "backend")
              if k in args}
        pg = dist.new_group(ranks=[_global(renv, m) for m in members], **kw)
        order = tuple(members if args.get("sort_ranks") is False else sorted(members))
    elif how == "subgroups":
        size = _int(args["size"], scope)
        group = parent.pg if parent is not None else renv.world_group
        sub_kw: dict[str, Any] = {"group": group} if group is not None else {}
        pg, subs = dist.new_subgroups(group_size=size, **sub_kw)  # type: ignore[no-untyped-call]
        count = len(subs)
        if renv.rank in base:
            start = base.index(renv.rank) // size * size
            order = tuple(base[start:start + size])
        want_count = len(base) // size
    elif how == "enumeration":
        lists = args["lists"]
        pg, subs = dist.new_subgroups_by_enumeration(  # type: ignore[no-untyped-call]
            [[_global(renv, r) for r in ranks] for ranks in lists])
        count = len(subs)
        order = next((tuple(sorted(ranks)) for ranks in lists if renv.rank in ranks), ())
        want_count = len(lists)
    else:  # split: positions in the parent group
        lists = args["lists"]
        pg = dist.split_group(parent_pg=parent.pg if parent is not None else renv.world_group,
                              split_ranks=[list(x) for x in lists])
        pos = base.index(renv.rank) if renv.rank in base else -1
        order = next((tuple(base[p] for p in sorted(x)) for x in lists if pos in x), ())
    member = renv.rank in order
    named[str(step.value)] = Named(pg, order, member, how)
    return _check(idx, str(step.value), renv, pg, order if member else None,
                  None if expect_none else dist.GroupMember.NON_GROUP_MEMBER,
                  count, want_count)


def _describe(renv: Any, pg: Any) -> str:
    if pg is None:
        return "None"
    if isinstance(pg, int) and pg == dist.GroupMember.NON_GROUP_MEMBER:
        return "NON_GROUP_MEMBER"
    try:
        return (f"members {dist.get_process_group_ranks(pg)}, this rank at "
                f"{dist.get_rank(pg)}")
    except Exception as exc:  # not a group torch knows: say what it is
        return f"{type(pg).__name__} ({str(exc)[:80]})"


def _check(idx: int, name: str, renv: Any, pg: Any, order: tuple[int, ...] | None,
           non_member: Any, count: int | None, want_count: int | None) -> TensorCheck:
    """Whether torch's return matches the membership the case implies (global ranks)."""
    got = _describe(renv, pg)
    if order is None:
        want = "NON_GROUP_MEMBER" if non_member is not None else "None"
    else:
        want = (f"members {[_global(renv, r) for r in order]}, this rank at "
                f"{order.index(renv.rank)}")
    if want_count is not None:
        want += f"; {want_count} subgroup(s)"
        got += f"; {count} subgroup(s)"
    ok = got == want
    return TensorCheck(tensor=f"group {name!r} (step {idx})", ok=ok, expectation="explicit",
                       wrong=0 if ok else 1, total=1,
                       first_wrong=[] if ok else [(0, want, got)])


def resolve(named: dict[str, Named], name: str, rank: int) -> tuple[Any, tuple[int, ...]]:
    """The group and member order an op step passes for ``group: NAME`` on this rank."""
    if name not in named:
        raise RuntimeError(f"harness: rank {rank} has no group {name!r}: its new_group step "
                           "did not run on this rank (see its 'ranks:')")
    made = named[name]
    if made.pg is None:
        # torch treats group=None as the default group: passing it would run the op on the
        # world, which is not what the case says.
        if made.member:
            raise RuntimeError(f"torch returned None for group {name!r} on rank {rank}, which "
                               "the case makes a member of it (the op was not called)")
        raise RuntimeError(f"harness: rank {rank} is not a member of group {name!r} (torch "
                           "returned None for it); limit the step with 'ranks:' to its members")
    return made.pg, made.order
