"""The ``op`` step: one call of an op of the op table, with its buffers and arguments.

``{op: NAME, <role>: TENSOR, ...}`` names a buffer for each of the op's roles (a list role may
list several tensors, a nested one lists of them), the op's own arguments (``src``/``dst``/
``tag``, ``form``, ``inplace``, ``splits``, the ``pg.*`` arguments, ``p2p`` entries of a
batch), ``reduce_op``/``premul_factor`` for reducing ops, ``group``, ``omit``, ``async`` and
``handle`` (docs/reference/programs.md), and ``call_returns`` (what the call itself returns:
``none``, ``work``, or ``auto``: None when synchronous, a Work when async). What each op
takes is the op table's business; the keys every step shares (``repeat``, ``returns``,
``raises`` ...) are checked in :mod:`harness.casefile.programcheck`.
"""

from __future__ import annotations

from typing import Any

from ... import dtypes, ops
from ...errors import CaseFileError, CaseFileErrors
from ...expr import parse
from ...model import Step, pack_tensor_list
from .. import addressing, lifecycle, opargs, pgargs, repeat, returns
from ..evaluate import PLAIN_ARGS, group_arg, omitted
from ..fields import check_expr, suggest
from .base import BuildContext, CheckContext, Path, RawStep, StepKind

# Op arguments a step may give besides src/dst/tag (each op lists the ones it takes).
STEP_OP_ARGS = ("form", "inplace", "splits", "timeout", "wait_all_ranks", *pgargs.KEYS)


def check_call_returns(ctx: CheckContext, path: Path, step: RawStep) -> list[CaseFileError]:
    """``call_returns`` checks one call that returns: not a repeated one, not one that must
    raise."""
    if "call_returns" not in step:
        return []
    where = (*path, "call_returns")
    if step.get("repeat", 1) != 1:
        return [ctx.case.error(where, "'call_returns' checks one call; it cannot be repeated",
                               "drop 'repeat:' or write the steps out")]
    if "raises" in step:
        return [ctx.case.error(where, "a call that must raise returns nothing",
                               "drop 'call_returns' or 'raises'")]
    return []


class OpStep(StepKind):
    """``{op: NAME, ...}``; its problems come after every common check of the step."""

    actions = ("op",)

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """Problems of the op, its buffers and its arguments; an op step with a known op adds
        its handle to those later steps may wait."""
        case, tensors = ctx.case, ctx.tensors
        if step["op"] not in ops.ALL_OPS:
            return [case.error((*path, "op"), f"unknown op {step['op']!r}",
                               suggest(step["op"], tuple(ops.ALL_OPS)))]
        op = ops.get(step["op"])
        errs = _check_buffers(ctx, path, step, op)
        errs += _check_args(ctx, path, step, op)
        for k, entry in enumerate(step.get("p2p", [])):
            if entry["tensor"] not in tensors:
                errs.append(case.error((*path, "p2p", k, "tensor"),
                                       f"unknown tensor {entry['tensor']!r}",
                                       suggest(entry["tensor"], tuple(tensors)) if tensors else
                                       "declare it under 'tensors:'"))
            errs.extend(addressing.check_p2p_entry(case, (*path, "p2p", k), entry))
        if "splits" in step:
            try:
                opargs.check_splits(case, (*path, "splits"), step["splits"])
            except CaseFileErrors as exc:
                errs.extend(exc.errors)
        for req in op.required_args:
            if req not in step and f"group_{req}" not in step and req not in step.get(
                    "omit", ()):
                errs.append(case.error(path, f"{op.name} needs '{req}:'"))
        errs += check_call_returns(ctx, path, step)
        if "handle" in step:
            ctx.handles.add(step["handle"])
        return errs

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The op step with its buffers, its arguments (expressions parsed, splits and the
        premul factor evaluated at this point) and its async mode."""
        s, names, ws = step, ctx.names, ctx.point["world_size"]
        op = ops.get(s["op"])
        per_rep = tuple((s[role.name][0], tuple(s[role.name])) for role in op.roles
                        if isinstance(s[role.name], list)
                        and repeat.per_repetition(s, role.form))
        # A buffer listed per repetition runs under its first name (rebound per repetition).
        bufs = tuple((role.name, s[role.name] if isinstance(s[role.name], str)
                      else s[role.name][0] if repeat.per_repetition(s, role.form)
                      else pack_tensor_list(s[role.name])) for role in op.roles)
        args: list[tuple[str, Any]] = []
        for key in ("src", "dst", "tag", "group_src", "group_dst"):
            if key in s:
                v = s[key]
                args.append((key, parse(v, (*names, *repeat.names(s)))
                             if isinstance(v, str) else v))
        for key in ("form", "inplace", *PLAIN_ARGS[1:]):
            if key in s:
                args.append((key, s[key]))
        for key in pgargs.KEYS:
            if key in s:
                args.append((key, pgargs.step_value(key, s[key], (*names, *repeat.names(s)))))
        args += sorted(omitted(op, s.get("omit")).items())
        if "splits" in s:
            n = len(s["group"]) if "group" in s else ws
            args.append(("splits", opargs.eval_splits(ctx.case, s["splits"], n, ctx.env,
                                                      (*ctx.path, "splits"))))
        for k, entry in enumerate(s.get("p2p", [])):
            bufs = (*bufs, (f"p2p.{k}", entry["tensor"]))
            peer = entry["peer"] if "peer" in entry else entry["group_peer"]
            if "group_peer" in entry:
                args.append((f"p2p.{k}.by_group", True))
            args.append((f"p2p.{k}.op", entry["op"]))
            args.append((f"p2p.{k}.peer", parse(peer, names) if isinstance(peer, str)
                         else peer))
            args.append((f"p2p.{k}.tag", entry.get("tag", 0)))
        if "group" in s:  # a list of ranks, or the name of a new_group step's group
            args.append(("group", group_arg(s["group"])))
        if "group_timeout" in s:
            args.append(("group_timeout", float(s["group_timeout"])))
        # A step's own reduce op (and premul factor) wins over the case's axis.
        if "reduce_op" in s:
            args.append(("reduce_op", s["reduce_op"]))
        if "premul_factor" in s:
            args.append(("premul_factor", ctx.builder.premul(s["premul_factor"], ctx.env,
                                                             (*ctx.path, "premul_factor"))))
        asy = (s.get("async", bool(ctx.point.get("async", False)))
               or op.name in ops.ALWAYS_ASYNC)
        rets = (returns.per_rank(ctx.case, s["returns"], ws, (*ctx.path, "returns"))
                if "returns" in s else None)
        return Step("op", ctx.line, op=op.name, bufs=bufs, args=tuple(args),
                    ranks=ctx.ranks, async_op=asy, handle=s.get("handle"),
                    stream=s.get("stream", "current"), returns=rets,
                    repeat=int(s.get("repeat", 1)),
                    slices=bool(s.get("slices", False)), per_repetition=per_rep,
                    warns=s.get("warns"),
                    register_work=bool(s.get("register_work", False)),
                    call_returns=returns.call_returns(s.get("call_returns"), asy),
                    **lifecycle.step_fields(s))


def _check_buffers(ctx: CheckContext, path: Path, step: RawStep, op: ops.Op
                   ) -> list[CaseFileError]:
    """Each role names a declared buffer of the right sort; no buffer the op does not take."""
    case, tensors, object_tensors = ctx.case, ctx.tensors, ctx.object_tensors
    errs: list[CaseFileError] = []
    role_names = {r.name for r in op.roles}
    for role in op.roles:
        tname = step.get(role.name)
        if isinstance(tname, list) and repeat.per_repetition(step, role.form):
            continue  # one tensor per repetition: checked by repeat.check
        if isinstance(tname, list):  # one list entry per named tensor
            errs.extend(_check_tensor_list(ctx, (*path, role.name), op, role, tname))
            continue
        holds_objects = bool(opargs.object_form(op, role.name))
        if tname is not None and tname in tensors and (
                holds_objects != (tname in object_tensors)):
            errs.append(case.error(
                (*path, role.name),
                f"{op.name}'s {role.name!r} buffer "
                + ("holds Python objects" if holds_objects else "is a tensor")
                + f"; {tname!r} is "
                + ("an object buffer" if tname in object_tensors else "a tensor"),
                "declare object buffers with 'dtype: object'" if holds_objects
                else "drop 'dtype: object' from it"))
        if tname is None:
            errs.append(case.error(path, f"{op.name} needs '{role.name}: TENSOR'",
                                   "name one of: " + ", ".join(tensors) if tensors else ""))
        elif tname not in tensors:
            errs.append(case.error((*path, role.name), f"unknown tensor {tname!r}",
                                   suggest(tname, tuple(tensors)) if tensors else
                                   "declare it under 'tensors:'"))
    for key in ("tensor", "input", "output", "objects"):
        if key in step and key not in role_names:
            errs.append(case.error((*path, key), f"{op.name} takes no {key!r} buffer",
                                   "its buffers: " + ", ".join(sorted(role_names))))
    return errs


def _check_args(ctx: CheckContext, path: Path, step: RawStep, op: ops.Op
                ) -> list[CaseFileError]:
    """The arguments the op takes, their expressions, its reduction and ``omit``."""
    case = ctx.case
    errs: list[CaseFileError] = []
    for key in ("src", "dst", "tag", *STEP_OP_ARGS, "p2p"):
        if key in step and key not in (*op.args, *(("p2p",) if op.p2p_entries else ())):
            errs.append(case.error((*path, key), f"{op.name} takes no argument {key!r}"))
        if key in ("src", "dst") and isinstance(step.get(key), str):
            try:
                check_expr(case, (*path, key), step[key], repeat.names(step))
            except CaseFileErrors as exc:
                errs.extend(exc.errors)
    for key in ("reduce_op", "premul_factor"):
        if key in step and not op.reduces:
            errs.append(case.error((*path, key), f"{op.name} does not reduce: "
                                   f"{key!r} does not apply", "drop it from this step"))
    if "reduce_op" in step and step["reduce_op"] not in dtypes.REDUCE_OPS:
        errs.append(case.error((*path, "reduce_op"),
                               f"unknown reduce op {step['reduce_op']!r}",
                               suggest(str(step["reduce_op"]), dtypes.REDUCE_OPS)))
    if isinstance(step.get("premul_factor"), str):
        try:
            check_expr(case, (*path, "premul_factor"), step["premul_factor"])
        except CaseFileErrors as exc:
            errs.extend(exc.errors)
    errs.extend(addressing.check_args(case, op, step, path))
    errs.extend(pgargs.check(case, op, step, path, repeat.names(step), entries=len(
        step["tensors"]) if isinstance(step.get("tensors"), list) else None))
    if "omit" in step and not op.defaults:
        errs.append(case.error((*path, "omit"), f"{op.name} takes no 'omit': it has no "
                               "argument with a default the harness knows"))
    else:
        errs.extend(opargs.check_omit(case, op, step, path,
                                      step.get("reduce_op", case.raw.get("reduce_op"))))
    if op.p2p_entries and "p2p" not in step:
        errs.append(case.error(path, f"{op.name} needs 'p2p:' (a list of "
                               "{op: isend|irecv, tensor: NAME, peer: RANK})"))
    return errs


def _check_tensor_list(ctx: CheckContext, path: Path, op: ops.Op, role: ops.Role,
                       names: list[Any]) -> list[CaseFileError]:
    """A list role given as a list of tensor names (entries of any shape and dtype); a
    nested role's entries may be lists of names themselves (``[[a, b], [c, d]]``)."""
    case, tensors = ctx.case, ctx.tensors
    if role.form not in ("list", "nested"):
        return [case.error(path, f"{op.name}'s {role.name!r} buffer is not a list of tensors",
                           "give one tensor name")]
    errs: list[CaseFileError] = []
    flat: list[tuple[Path, Any]] = []
    for i, item in enumerate(names):
        if isinstance(item, list) and role.form != "nested":
            errs.append(case.error((*path, i), f"{op.name}'s {role.name!r} buffer is a list "
                                   "of tensors, not a list of lists", "give tensor names"))
        elif isinstance(item, list):
            flat.extend(((*path, i, k), n) for k, n in enumerate(item))
        else:
            flat.append(((*path, i), item))
    for where, name in flat:
        if name not in tensors:
            errs.append(case.error(where, f"unknown tensor {name!r}",
                                   suggest(name, tuple(tensors)) if tensors else
                                   "declare it under 'tensors:'"))
        elif name in ctx.object_tensors:
            errs.append(case.error(where, f"{name!r} is an object buffer; list entries "
                                   "are tensors"))
    return errs


KIND = OpStep()
