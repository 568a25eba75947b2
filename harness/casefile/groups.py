"""Named process groups made by a program's ``new_group`` steps: validation and expansion.

A ``{new_group: NAME, ...}`` step calls one of torch's group constructors on the ranks that
run it, and later op steps name the result with ``group: NAME``:

- ``members: [...]`` -> ``new_group(ranks=...)``, with ``sort_ranks``,
  ``use_local_synchronization`` and ``backend`` (another backend than the world's) passed
  through when given (entries may be expressions over
  ``rank``, so each rank may name its own group, as upstream's local-synchronization tests do);
- ``subgroups: N`` -> ``new_subgroups(group_size=N)`` (``parent:`` another named group:
  ``group=``), and ``subgroups: [[...], ...]`` -> ``new_subgroups_by_enumeration``: NAME is
  this rank's own subgroup;
- ``split: [[...], ...]`` -> ``split_group(parent_pg, split_ranks)`` (``parent:`` a named group,
  else the world).

Creating a group is a step, so an error raised by the constructor is an error of that step
(``raises:`` states it) and the verdict names it. Runs in the pytest process: no torch.
"""

from __future__ import annotations

from typing import Any

from ..errors import CaseFileError, CaseFileErrors, ExprError
from ..expr import Expr, parse
from ..model import Case, Step
from .fields import check_expr, suggest

HOW = ("members", "subgroups", "split")
OPTIONS = ("sort_ranks", "use_local_synchronization", "backend")
GROUP_KEYS = (*HOW, "parent", *OPTIONS)
Path = tuple[Any, ...]


def _expr(case: Case, path: Path, value: Any, errs: list[CaseFileError]) -> None:
    if isinstance(value, str):
        try:
            check_expr(case, path, value)
        except CaseFileErrors as exc:
            errs.extend(exc.errors)


def check(case: Case, steps: list[dict[str, Any]]) -> list[CaseFileError]:
    """Problems of ``new_group`` steps and of op steps that name a group by its name."""
    errs: list[CaseFileError] = []
    made: dict[str, int] = {}
    for idx, step in enumerate(steps):
        path: Path = ("steps", idx)
        if "new_group" not in step:
            for key in GROUP_KEYS:
                if key in step:
                    errs.append(case.error((*path, key), f"'{key}' belongs to new_group steps",
                                           "e.g. {new_group: pairs, subgroups: 2}"))
            name = step.get("group")
            if isinstance(name, str) and name not in made:
                errs.append(case.error((*path, "group"), f"no earlier new_group step makes "
                                       f"group {name!r}",
                                       suggest(name, tuple(made)) if made else
                                       "add {new_group: NAME, members: [0, 1]} before it"))
            if isinstance(name, str) and "splits" in step:
                errs.append(case.error((*path, "splits"), "'splits' needs the group's size at "
                                       "collection: give the group as a list of ranks"))
            continue
        name = step["new_group"]
        if name in made:
            errs.append(case.error((*path, "new_group"), f"group {name!r} is already made by "
                                   f"step {made[name]}", "give each group its own name (two "
                                   "groups may have the same members)"))
        hows = [k for k in HOW if k in step]
        if len(hows) != 1:
            errs.append(case.error(path, "a new_group step needs exactly one of 'members' "
                                   "(new_group), 'subgroups' (new_subgroups, or "
                                   "new_subgroups_by_enumeration with a list of lists) and "
                                   "'split' (split_group)"))
        how = hows[0] if len(hows) == 1 else ""
        for key in OPTIONS:
            if key in step and how != "members":
                errs.append(case.error((*path, key), f"'{key}' is an option of new_group: it "
                                       "applies with 'members:' only"))
        if "parent" in step:
            if how == "members" or (how == "subgroups" and isinstance(step["subgroups"], list)):
                errs.append(case.error((*path, "parent"), "'parent' applies to 'split' and to "
                                       "'subgroups: N' only"))
            elif step["parent"] not in made:
                errs.append(case.error((*path, "parent"), f"no earlier new_group step makes "
                                       f"group {step['parent']!r}"))
        for i, v in enumerate(step.get("members", [])):
            _expr(case, (*path, "members", i), v, errs)
        _expr(case, (*path, "subgroups"), step.get("subgroups"), errs)
        made.setdefault(name, idx)
    return errs


def _value(value: Any, names: tuple[str, ...]) -> Any:
    return parse(value, names) if isinstance(value, str) else value


def make_step(raw: dict[str, Any], line: int, ranks: tuple[int, ...] | Expr | None,
              names: tuple[str, ...]) -> Step:
    """The :class:`Step` of a validated ``new_group`` step (expressions parsed)."""
    how = next(k for k in HOW if k in raw)
    args: list[tuple[str, Any]] = [("how", how)]
    if how == "members":
        args.append(("members", tuple(_value(v, names) for v in raw["members"])))
    elif how == "subgroups" and isinstance(raw["subgroups"], list):
        args[0] = ("how", "enumeration")
        args.append(("lists", tuple(tuple(x) for x in raw["subgroups"])))
    elif how == "subgroups":
        args.append(("size", _value(raw["subgroups"], names)))
    else:
        args.append(("lists", tuple(tuple(x) for x in raw["split"])))
    args += [(k, raw[k]) for k in ("parent", *OPTIONS) if k in raw]
    return Step("new_group", line, ranks=ranks, value=raw["new_group"], args=tuple(args))


def expects_error(case: Case, raw: dict[str, Any]) -> bool:
    """Whether the case (or one of its overrides) or this step declares that something raises:
    then torch's own rejection of a membership is what the case tests, and it must reach torch
    (upstream's tests of new_subgroups and new_group argument checks)."""
    return bool(case.raw.get("raises") or raw.get("raises")
                or any(isinstance(o, dict) and o.get("raises")
                       for o in case.raw.get("overrides", [])))


def check_membership(case: Case, raw: dict[str, Any], step: Step, path: Path,
                     env: dict[str, Any], ranks: tuple[int, ...] | None) -> None:
    """Evaluate a group step's membership (as :func:`make_step` parsed it) at this world
    size, at collection: an expression that fails is an error at its line, and so are members
    outside the world (or the parent's positions for ``split``) and duplicates, unless the
    case expects an error (see :func:`expects_error`)."""
    ws = int(env["world_size"])
    strict = not expects_error(case, raw)
    args = dict(step.args)
    how = args["how"]
    if how == "members":
        for r in ranks if ranks is not None else range(ws):
            got = [_member(case, (*path, "members", i), v, {**env, "rank": r})
                   for i, v in enumerate(args["members"])]
            if strict:
                _check_ranks(case, (*path, "members"), got, ws, f"on rank {r}, members")
    elif how == "subgroups":  # new_subgroups(group_size)
        size = _member(case, (*path, "subgroups"), args["size"], {**env, "rank": 0})
        if strict and not 1 <= size <= ws:
            raise case.error((*path, "subgroups"), f"group size {size} is outside 1..{ws} "
                             f"(world_size {ws})", "declare 'raises:' to test torch's check")
    elif strict and (how == "enumeration" or (how == "split" and "parent" not in raw)):
        key = "subgroups" if how == "enumeration" else "split"
        flat = [x for lst in args["lists"] for x in lst]
        _check_ranks(case, (*path, key), flat, ws, key)


def _member(case: Case, path: Path, value: Any, env: dict[str, Any]) -> int:
    if isinstance(value, Expr):
        try:
            value = value(env)
        except (ExprError, KeyError, ZeroDivisionError, ArithmeticError) as exc:
            raise case.error(path, f"bad expression {value.source!r} at world_size "
                             f"{env['world_size']}, rank {env['rank']}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise case.error(path, f"a group member must be a whole number, got {value!r}")
    return value


def _check_ranks(case: Case, path: Path, ranks: list[int], ws: int, what: str) -> None:
    outside = [r for r in ranks if not 0 <= r < ws]
    if outside:
        raise case.error(path, f"{what} names rank {outside[0]}, outside world_size {ws}",
                         "declare 'raises:' to test torch's check of it")
    seen: set[int] = set()
    for r in ranks:
        if r in seen:
            raise case.error(path, f"{what} names rank {r} twice",
                             "declare 'raises:' to test torch's check of it")
        seen.add(r)


def splits(steps: tuple[Step, ...]) -> bool:
    """Whether a program calls split_group (its pool binds the default group to the GPU)."""
    return any(s.kind == "new_group" and dict(s.args)["how"] == "split" for s in steps)


def uses_groups(steps: tuple[Step, ...]) -> bool:
    """Whether a program makes named groups (such an instance runs on a private pool)."""
    return any(s.kind == "new_group" for s in steps)
