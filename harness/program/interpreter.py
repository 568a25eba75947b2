"""The step interpreter: run one :class:`Instance` inside a rank.

This is the per-rank code shared by the harness's own pools and by the "external ranks" mode
(ranks started by torchrun/srun): it needs only an initialized default process group. Its
public pieces are what the ordering probes reuse: :func:`build_buffers` (an instance's
buffers, fresh), :func:`call_op` (one op step), :func:`check_results` (every expectation that
concerns this rank); :func:`run_instance` runs the whole program with them.

Kept whole: :func:`run_instance`'s step loop, the buffers it builds and the checks it makes at
the end share one per-instance state (written tensors, pending async work, the step a failure
belongs to); the step kinds that stand apart already live in their own modules (timeline,
groups, graphs, lifecycle, perf).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .. import ops
from ..expr import Expr
from ..model import (
    BUILDING_BUFFERS,
    GROUP_PHASE,
    ORDER_SENSITIVE,
    TENSOR_LIST,
    Fill,
    Instance,
    RankResult,
    Step,
    StepEvent,
    TensorCheck,
    TensorSpec,
    Tolerance,
    case_groups,
    tensor_list,
    tensor_names,
)
from . import contract, fp64, guards, identity, lifecycle, objects, recovery, stepchecks, tensors
from . import groups as group_steps
from .graphs import Graphs
from .timeline import STEP_KINDS, ProgramState

REDUCE_OPS = {
    "sum": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX", "band": "BAND",
    "bor": "BOR", "bxor": "BXOR", "avg": "AVG",
}


@dataclass
class RankEnv:
    """What a rank knows about itself; ``groups`` caches subgroups across instances.

    ``rank`` and ``world_size`` are the instance's view: a case always sees ranks
    0..world_size-1. When the instance runs on a subgroup of a larger launched world
    (external-ranks mode packs instances side by side), ``members`` holds the global ranks
    of that subgroup in order and ``world_group`` its process group; ranks the program names
    (``src``, ``dst``, peers, subgroup lists) are mapped to global ranks only where they are
    handed to torch.distributed.
    """

    rank: int
    world_size: int
    device: str
    progress: Any = None  # shared int array [instance seq, step index], or None
    groups: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    seq: int = 0
    members: tuple[int, ...] | None = None  # None: the default group is the whole world
    world_group: Any = None
    # Groups the running instance's new_group steps made, by name (never kept across
    # instances: such an instance runs on a private pool).
    named: dict[str, group_steps.Named] = field(default_factory=dict)
    # The pool's store and group timeout, for a program that re-forms its world (``reform``),
    # and the ranks of the launched world.
    store_path: str = ""
    pg_timeout_s: float = 600.0
    pool_world_size: int = 0
    # After ``reform``/``shrink``: a launch rank -> its rank in the new world (None before).
    remap: dict[int, int] | None = None
    # The extra runs of one instance (iterations, deterministic): each buffer's allocation of
    # the first run, refilled in place (fresh poison and guards) instead of a new one.
    reuse: dict[str, guards.Region] | None = None

    def to_global(self, rank: int) -> int:
        """The global rank of the instance's rank ``rank`` (in the re-formed world, after a
        ``reform`` or ``shrink``: -1 for a rank it left out, which torch then rejects)."""
        if self.remap is not None:
            return self.remap.get(rank, -1)
        return rank if self.members is None else self.members[rank]


def _reduce_op(name: str | None, factor: float, tensor_of: torch.Tensor | None = None) -> Any:
    """The ReduceOp for ``name``; PREMUL_SUM's factor is a 1-element tensor shaped like
    ``tensor_of`` (its dtype and device) when given, else a Python float."""
    if name is None:
        return None
    if name == "premul_sum":
        maker = getattr(dist, "_make_nccl_premul_sum", None)
        if maker is None:
            raise RuntimeError("this torch has no PREMUL_SUM (torch.distributed."
                               "_make_nccl_premul_sum)")
        if tensor_of is not None:
            return maker(torch.tensor([factor], dtype=tensor_of.dtype, device=tensor_of.device))
        return maker(factor)
    return getattr(dist.ReduceOp, REDUCE_OPS[name])


def in_ranks(step: Step, rank: int, world_size: int, env: dict[str, Any]) -> bool:
    """Whether ``step`` runs on ``rank`` (its ``ranks:`` list or expression)."""
    return step.runs_on(rank, world_size, env)


def _group(renv: RankEnv, ranks: tuple[int, ...] | str | None,
           timeout: float | None = None) -> tuple[Any, tuple[int, ...]]:
    if ranks is None:
        return renv.world_group, tuple(range(renv.world_size))
    if isinstance(ranks, str):  # made by a new_group step of this instance
        return group_steps.resolve(renv.named, ranks, renv.rank)
    members = tuple(sorted(renv.to_global(r) for r in ranks))
    # A group made with its own timeout (``group_timeout``) is another group than the plain one.
    key: tuple[Any, ...] = members if timeout is None else (*members, ("timeout", timeout))
    if key not in renv.groups:
        if timeout is not None:
            # Meet first, under the world group's own (long) timeout: new_group connects its
            # members under ``timeout``, and a rank late for reasons of load would let a
            # short one expire before the group exists (observed: "Connect timeout").
            dist.barrier(group=renv.world_group)
        renv.groups[key] = (dist.new_group(list(members)) if timeout is None else
                            dist.new_group(list(members),
                                           timeout=datetime.timedelta(seconds=timeout)))
    # new_group orders members by global rank whatever order the list gives.
    return renv.groups[key], tuple(sorted(ranks))


# Arguments that name a rank: the case gives the instance's rank, torch wants the global one.
RANK_ARGS = ("src", "dst")


def _torch_args(args: dict[str, Any], renv: RankEnv) -> dict[str, Any]:
    if renv.members is None and renv.remap is None:
        return args
    return {k: renv.to_global(v) if isinstance(v, int) and not isinstance(v, bool)
            and (k in RANK_ARGS or k.endswith(".peer")) else v
            for k, v in args.items()}


def prepare_groups(inst: Instance, renv: RankEnv) -> None:
    """Create every subgroup the program uses, in program order, on every rank.

    ``new_group`` is collective over the whole world, so non-members must call it too, and in
    the same order; caching per pool keeps later instances from creating it again.
    """
    made = False
    for index, (ranks, timeout) in enumerate(case_groups(inst.steps)):
        if renv.progress is not None:  # a group the backend never forms hangs here
            renv.progress[1] = GROUP_PHASE - index
            made = True
        _group(renv, ranks, timeout)
    if made:
        renv.progress[1] = BUILDING_BUFFERS


def _shape(shape: tuple[Any, ...] | None) -> tuple[int, ...] | None:
    """Shapes are concrete after expansion (expressions were evaluated in the parent)."""
    return None if shape is None else tuple(int(d) for d in shape)


def _device(renv: RankEnv) -> torch.device:
    if renv.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _object_forms(inst: Instance) -> dict[str, str]:
    """For each object buffer, whether ops take it as one object or as a list of objects."""
    forms: dict[str, str] = {}
    for step in inst.steps:
        if step.op is not None:
            op = ops.get(step.op)
            for role_name, tname in step.bufs:
                forms.setdefault(tname, op.role(role_name).form)
    return forms


def _materialize(inst: Instance, spec: TensorSpec, rank: int, world_size: int,
                 env: dict[str, Any], fill: Fill | None = None) -> Any:
    """Rank ``rank``'s contents of ``spec`` (a CPU tensor, or an object buffer)."""
    fill = (fill or spec.init).for_rank(rank)
    shape = _shape(spec.shape_for(rank))
    if spec.dtype == "object":
        return objects.materialize(fill, _object_forms(inst).get(spec.name, "objects"), shape,
                                   rank)
    return tensors.materialize(fill, shape, tensors.torch_dtype(spec.dtype), rank, world_size,
                               env, inst.reduce_op, spec.entries_for(rank))


def _spec(inst: Instance, name: str) -> TensorSpec:
    return next(s for s in inst.tensors if s.name == name)


def build_buffers(inst: Instance, renv: RankEnv, env: dict[str, Any],
                  watch: guards.Watch | None = None) -> dict[str, Any]:
    """Every buffer of ``inst`` for this rank, freshly filled, on the rank's device, each
    tensor inside guard regions (``watch``, when given, keeps them to be checked)."""
    bufs: dict[str, Any] = {}
    dev = _device(renv)
    for spec in inst.tensors:
        t = _materialize(inst, spec, renv.rank, renv.world_size, env)
        if spec.sparse is not None:
            bufs[spec.name] = tensors.to_sparse(t.to(dev), spec.sparse.sparse_dim,
                                                spec.sparse.uncoalesced)
            continue
        if spec.dtype == "object":
            bufs[spec.name] = t
            continue
        bufs[spec.name], region = guards.wrap(spec.name, tensors.at_offset(
            tensors.with_layout(t.to(dev), spec.layout), spec.offset), spec.guard_bytes(),
            renv.reuse.get(spec.name) if renv.reuse is not None else None)
        if region is not None and watch is not None:
            watch.regions[spec.name] = region
        if region is not None and renv.reuse is not None:
            renv.reuse[spec.name] = region
    return bufs


def _snapshot(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tensors.snapshot(value)
    return objects.snapshot(value)


def step_args(step: Step, rank: int, world_size: int, env: dict[str, Any]) -> dict[str, Any]:
    """The op arguments of ``step`` on ``rank``, expressions evaluated."""
    out: dict[str, Any] = {}
    for k, v in step.args:
        if isinstance(v, Expr):
            v = v({**env, "rank": rank, "world_size": world_size})
        out[k] = v
    return out


# Extra observations after a successful run (the ordering probes): (inst, renv, env) -> dict.
Probes = Callable[[Instance, RankEnv, dict[str, Any]], dict[str, Any]]
# Timing after the checks, on the same buffers (--perf): (inst, renv, env, bufs, checks_ok).
Timer = Callable[[Instance, RankEnv, dict[str, Any], dict[str, Any], bool], dict[str, Any]]


def run_instance(inst: Instance, renv: RankEnv, probes: Probes | None = None,
                 timer: Timer | None = None) -> RankResult:
    """Execute ``inst`` on this rank and check every expectation that concerns it.

    ``probes``, when given, runs after the checks and its observations join the result's
    ordering facts; an exception there is reported like one in the program. ``timer``, when
    given and the instance has a perf plan, times the op on the same buffers right after the
    checks (before the probes, which build their own buffers).
    """
    t0 = time.perf_counter()
    res = RankResult(rank=renv.rank, status="ok")
    env: dict[str, Any] = dict(inst.params)
    step_idx = -1
    handles: dict[str, tuple[Any, StepEvent]] = {}
    group_checks: list[TensorCheck] = []
    renv.named = {}
    modes = contextlib.ExitStack()
    try:
        modes.enter_context(torch_modes(inst.torch_modes))
        if any(s.kind == "set_device" for s in inst.steps):  # the rank's own GPU afterwards
            modes.callback(torch.cuda.set_device, torch.cuda.current_device())
        prepare_groups(inst, renv)
        watch = guards.Watch()
        bufs = build_buffers(inst, renv, env, watch)
        before = {n: _snapshot(t) for n, t in bufs.items()}
        written: set[str] = set()
        rets: list[tuple[int, Step, dict[str, Any]]] = []
        waited: dict[str, Any] = {}  # handle -> its Work, once waited (work_state steps)
        late: list[TensorCheck] = []  # checks of failing waits and Work states, in order
        state = ProgramState(inst, renv.rank, renv.world_size, renv.device, t0,
                                           env, bufs, before, written)
        clock = lifecycle.Clock(inst)
        graphs = Graphs(renv.device)
        for step_idx, step in enumerate(inst.steps):
            if renv.progress is not None:
                renv.progress[1] = step_idx
            if not in_ranks(step, renv.rank, renv.world_size, env):
                continue
            ev = StepEvent(step_idx, step.describe(), time.perf_counter() - t0, 0.0)
            with lifecycle.expecting(step, step_idx, res):
                if step.kind == "op":
                    state.touching([name for _, name in step.bufs])
                    returned: dict[str, Any] = {}
                    if step.returns is not None or step.warns is not None:
                        rets.append((step_idx, step, returned))
                    # Warnings are recorded only for steps that declare one (``warns:``).
                    catcher: Any = (warnings.catch_warnings(record=True)
                                    if step.warns is not None else contextlib.nullcontext([]))
                    clock.enter(step_idx)
                    with state.stream(step), _registering(step), catcher as caught:
                        if step.warns is not None:
                            warnings.simplefilter("always")  # even if it warned before
                        work = (call_op(inst, step, renv, env, bufs, written, returned)
                                if step.repeat == 1 else
                                _repeated(inst, step, renv, env, bufs, written, returned))
                        ev.t_return = time.perf_counter() - t0
                        state.issued(step, work, ev)
                    watch.check(_guarded(step), f"{step.op} (step {step_idx})",
                                "after the call returned")
                    if step.call_returns is not None:
                        late.append(contract.call_returned(f"step {step_idx}", step, work))
                    returned["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
                    if work is not None:
                        state.returned(work, ev, receive_buffers(step))
                        if step.handle:
                            handles[step.handle] = (work, ev)
                        else:
                            state.wait(work, ev)
                            watch.check(_guarded(step), f"{step.op} (step {step_idx})",
                                        "after wait()")
                    if work is None or not step.handle:
                        clock.done(step_idx)
                elif step.kind == "wait":
                    timeout = dict(step.args).get("timeout")
                    for h in step.waits:
                        if h in handles:
                            work, wev = handles.pop(h)
                            waited[h] = work  # before the wait, which may raise (``raises:``)
                            if timeout is not None:  # raises if the work misses the bound
                                work.wait(datetime.timedelta(seconds=float(timeout)))
                            with _registering(step):
                                state.wait(work, wev,
                                           thread=bool(dict(step.args).get("thread")))
                            watch.check(_guarded(inst.steps[wev.index]),
                                        f"{inst.steps[wev.index].op} (step {wev.index})",
                                        "after wait()")
                            clock.done(wev.index)
                    ev.t_return = time.perf_counter() - t0
                elif step.kind == "drop":  # ``del work``: no reference of ours is left
                    for h in step.waits:
                        handles.pop(h, None)
                        state.works.pop(h, None)
                    ev.t_return = time.perf_counter() - t0
                elif step.kind in CONTRACT_KINDS:
                    group = _group(renv, dict(step.args)["group"])[0] if dict(step.args).get(
                        "group") is not None else renv.world_group
                    check = contract.run(step_idx, step, group, {
                        **env, "rank": renv.rank, "world_size": renv.world_size})
                    if check is not None:
                        late.append(check)
                    ev.t_return = time.perf_counter() - t0
                elif step.kind == "new_group":
                    group_checks.append(group_steps.create(step, step_idx, renv, env,
                                                           renv.named))
                    ev.t_return = time.perf_counter() - t0
                elif step.kind == "work_state":
                    h = step.waits[0]
                    late.append(stepchecks.check_work_state(
                        step_idx, step, waited.get(h, handles.get(h, (None, None))[0]),
                        {**env, "rank": renv.rank, "world_size": renv.world_size}))
                    ev.t_return = time.perf_counter() - t0
                elif step.kind == "identity":
                    late.append(identity.check(step_idx, step, renv, inst.backend))
                    ev.t_return = time.perf_counter() - t0
                elif step.kind in STEP_KINDS:
                    state.run(step, step_idx)
                    ev.t_return = time.perf_counter() - t0
                elif step.kind in CUDA_KINDS:
                    state.touching(list(bufs))  # a capture or replay may write any of them
                    _cuda_step(inst, step, renv, env, bufs, written, graphs, state, handles,
                               late)
                    ev.t_return = time.perf_counter() - t0
                elif step.kind in ("set_timeout", "destroy", "abort_group"):
                    _lifecycle_step(step, renv)
                    ev.t_return = time.perf_counter() - t0
                elif step.kind in ("reform", "shrink"):
                    recovery.run(step, step_idx, renv, inst.backend)
                    ev.t_return = time.perf_counter() - t0
                else:
                    _special(step)
                    ev.t_return = time.perf_counter() - t0
                    if step.kind == "sleep":
                        res.phases["sleep"] = (res.phases.get("sleep", 0.0)
                                               + ev.t_return - ev.t_enter)
                    if step.kind == "sync":
                        state.synchronized()
            res.events.append(ev)
        step_idx = len(inst.steps)
        for work, wev in handles.values():  # never leave work in flight: the pool is reused
            state.wait(work, wev)
            clock.done(wev.index)
        state.wait_held()
        res.timing = clock.facts()
        if renv.device == "cuda":
            torch.cuda.synchronize()
            state.synchronized()
        res.checks = group_checks + check_results(inst, renv, env, bufs, before, written)
        watch.check(watch.regions, "the program", "at its end")  # captures, replays, ...
        res.checks += watch.checks()
        res.checks += [stepchecks.check_return(i, step, renv.rank, renv.world_size, env, got)
                       for i, step, got in rets
                       if step.returns is not None and step.returns[renv.rank] is not None]
        res.checks += [stepchecks.check_warns(i, step, got) for i, step, got in rets
                       if step.warns is not None]
        res.checks += late
        if timer is not None and inst.perf is not None:
            t_perf = time.perf_counter()
            try:
                res.perf = timer(inst, renv, env, bufs, all(c.ok for c in res.checks))
            except Exception as exc:  # a failed measurement is no failed check
                res.perf = {"not_timed": f"timing raised {type(exc).__name__}: "
                                         f"{str(exc)[:200]}"}
            res.phases["perf"] = time.perf_counter() - t_perf
        t_probes = time.perf_counter()
        res.ordering = {**state.results(), **(probes(inst, renv, env) if probes else {})}
        if probes:
            res.phases["probes"] = time.perf_counter() - t_probes
    except Exception as exc:  # reported to the parent, which decides the outcome
        res.status = "raised"
        res.exc_type = type(exc).__name__
        res.exc_message = str(exc)
        res.traceback = traceback.format_exc()
        res.step = step_idx
        res.in_flight = len(handles)  # the parent does not reuse a pool with work in flight
    finally:
        modes.close()  # the pool's next instance starts with torch's modes as they were
    res.duration = time.perf_counter() - t0
    return res


@contextlib.contextmanager
def torch_modes(names: tuple[str, ...]) -> Iterator[None]:
    """Run under the case's global torch modes (``torch_modes:``), restored afterwards."""
    with contextlib.ExitStack() as stack:
        if "deterministic_algorithms" in names:
            before = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
            torch.use_deterministic_algorithms(True)
            stack.callback(lambda: torch.use_deterministic_algorithms(before[0],
                                                                      warn_only=before[1]))
        if "inference_mode" in names:
            stack.enter_context(torch.inference_mode())
        yield


def _guarded(step: Step) -> list[str]:
    """The buffers an op step hands over, whose guards are read after it."""
    return [n for _, t in step.bufs for n in tensor_names(t)]


def receive_buffers(step: Step) -> list[str]:
    """The buffers a point-to-point step receives into (none for other ops)."""
    assert step.op is not None
    op = ops.get(step.op)
    if op.family != "p2p":
        return []
    args = dict(step.args)
    return [name for role, name in step.bufs
            if (args.get(f"{role}.op") == "irecv" if role.startswith("p2p.")
                else op.role(role).access != "in")]


def call_op(inst: Instance, step: Step, renv: RankEnv, env: dict[str, Any],
            bufs: dict[str, torch.Tensor], written: set[str],
            returned: dict[str, Any] | None = None, timing: bool = False) -> Any:
    """Call the op of ``step`` on this rank's buffers; returns its Work (or None).

    Buffers the op may write are added to ``written`` (what must come back unchanged is
    decided from it). ``returned`` receives the op's checkable return value (``returns:``).
    ``timing``: a --perf loop after the checks (see ``CallContext.timing``).
    """
    return bind_op(inst, step, renv, env, bufs, written, returned, timing)()


def bind_op(inst: Instance, step: Step, renv: RankEnv, env: dict[str, Any],
            bufs: dict[str, torch.Tensor], written: set[str],
            returned: dict[str, Any] | None = None, timing: bool = False
            ) -> Callable[[], Any]:
    """:func:`call_op` with everything but the call itself done once: arguments evaluated,
    group resolved, buffers handed over. The --perf loop issues the bound call many times;
    evaluating the step's expressions on every iteration was harness time inside the timed
    loop (and, between an isend and its irecv, it delayed posting the receive)."""
    assert step.op is not None
    op = ops.get(step.op)
    args = step_args(step, renv.rank, renv.world_size, env)
    group, group_ranks = _group(renv, args.pop("group", None), args.pop("group_timeout", None))
    reduce_op = args.pop("reduce_op", inst.reduce_op)
    premul = float(args.pop("premul_factor", inst.premul_factor))
    stepchecks.group_addressing(args, group_ranks)
    passed: dict[str, Any] = {}
    for role_name, tname in step.bufs:
        role = op.role(role_name)
        root = (_root_of(args, group_ranks) if role.only == "root" else
                args.get("src") if role.only == "src" else args.get("dst"))
        # A list of names in a step is what the case hands over, root or not (process-group
        # methods: a non-root passing an output list is one of Gloo's input checks).
        named = role.only == "root" and tname.startswith(TENSOR_LIST)
        if role.only != "all" and renv.rank != root and not named:
            passed[role_name] = None
            continue
        if tname.startswith(TENSOR_LIST):  # one list entry per named tensor (or name list)
            passed[role_name] = [[bufs[m] for m in n] if isinstance(n, list) else bufs[n]
                                 for n in tensor_list(tname)]
            if role.access != "in":
                written.update(tensor_names(tname))
            continue
        t = bufs[tname]
        entries = (_spec(inst, tname).entries_for(renv.rank)
                   if role.form in ("list", "nested") else None)
        if entries is not None and role.form == "nested":  # one list per group member
            views = tensors.entry_views(t, entries)
            per = len(views) // max(1, len(group_ranks))
            passed[role_name] = [views[m * per:(m + 1) * per] for m in range(len(group_ranks))]
        elif entries is not None:  # entries of different shapes: views of the flat buffer
            passed[role_name] = tensors.entry_views(t, entries)
        elif role.form == "list":
            passed[role_name] = list(t.unbind(0))
        elif role.form == "nested":
            passed[role_name] = [list(x.unbind(0)) for x in t.unbind(0)]
        else:
            passed[role_name] = t
        if role.access != "in":
            written.add(tname)
    ctx = ops.CallContext(dist=dist, rank=renv.rank, world_size=renv.world_size, group=group,
                          group_ranks=group_ranks,
                          reduce_op=_reduce_op(reduce_op, premul,
                                               stepchecks.factor_like(inst, passed))
                          if op.reduces else None,
                          async_op=step.async_op, args=_torch_args(args, renv), timing=timing,
                          returned=returned if returned is not None else {})
    call = op.call
    return lambda: call(ctx, passed)


def _root_of(args: dict[str, Any], group_ranks: tuple[int, ...]) -> int | None:
    """The rank at group position ``root_rank`` (None when it is outside the group)."""
    pos = args.get("root_rank", 0)
    return group_ranks[pos] if isinstance(pos, int) and 0 <= pos < len(group_ranks) else None


def _repeated(inst: Instance, step: Step, renv: RankEnv, env: dict[str, Any],
              bufs: dict[str, Any], written: set[str], returned: dict[str, Any]) -> Any:
    """Issue the op ``step.repeat`` times; async Works stay in flight as one WorkList."""
    listed = dict(step.per_repetition)
    # Every tensor the step names is sliced, those of a list buffer (``tensors: [a, b]``) too.
    names = {n for _, t in step.bufs for n in tensor_names(t)} - set(listed)
    works: list[Any] = []
    for rep in range(step.repeat):
        view = {n: t[rep] for n, t in bufs.items() if n in names} if step.slices else bufs
        # A buffer listed per repetition: its first name stands for repetition rep's tensor.
        view = {**view, **{first: bufs[each[rep]] for first, each in listed.items()}}
        work = call_op(inst, step, renv, {**env, "rep": rep}, {**bufs, **view}, written,
                       returned)
        if work is not None:
            works.append(work)
    written.update(name for each in listed.values() for name in each)
    return ops.p2p.WorkList(works) if works else None


def _lifecycle_step(step: Step, renv: RankEnv) -> None:
    """``set_timeout`` / ``destroy`` / ``abort_group`` on the step's group, or on the
    instance's world."""
    args = dict(step.args)
    if args.get("group") is not None:
        # expand gives a name (str) or a tuple of ranks, as _group takes them
        group, _ = _group(renv, args["group"], args.get("group_timeout"))
    else:
        group = renv.world_group  # None: the default group (the whole launched world)
    if step.kind == "set_timeout":
        lifecycle.set_timeout(group if group is not None else dist.group.WORLD,
                              float(step.value))
    elif step.kind == "abort_group":
        lifecycle.abort(group)
        if group is None:
            renv.groups.clear()  # every group of the world went with it
    else:
        lifecycle.destroy(group)


CUDA_KINDS = ("capture", "replay", "block_current_stream", "wait_stream")
# The API-contract steps run by harness.program.contract.
CONTRACT_KINDS = ("seq_number", "work_registry", "enable_timing", "set_device",
                  "current_device", "stream_idle")


def _registering(step: Step) -> Any:
    """``register_work: true``: the call's Work is registered under its tensors, where
    ``torch.ops.c10d_functional.wait_tensor`` finds it."""
    if not step.register_work:
        return contextlib.nullcontext()
    from torch.distributed import _functional_collectives as funcol

    return funcol.allow_inflight_collective_as_graph_input_ctx()


def _cuda_step(inst: Instance, step: Step, renv: RankEnv, env: dict[str, Any],
               bufs: dict[str, Any], written: set[str], graphs: Graphs, state: ProgramState,
               handles: dict[str, tuple[Any, StepEvent]], late: list[TensorCheck]) -> None:
    """One CUDA-only step (see :mod:`harness.program.graphs`); the ``call_returns`` checks of
    captured op steps join ``late``."""
    if step.kind == "replay":
        graphs.replay(step)
    elif step.kind == "wait_stream":
        graphs.wait_stream(step, state.side)
    elif step.kind == "block_current_stream":
        graphs.block_current_stream(step, handles.get(step.waits[0], (None, None))[0])
    else:

        def run_inner(inner: Step, works: dict[str, Any]) -> None:
            # No timeline facts inside a capture: is_completed() queries events, which a
            # capture forbids; the captured works are waited (recorded) right here.
            if not in_ranks(inner, renv.rank, renv.world_size, env):
                return
            if inner.kind == "wait":
                for h in inner.waits:
                    if h in works:
                        works.pop(h).wait()
                return
            work = (call_op(inst, inner, renv, env, bufs, written) if inner.repeat == 1 else
                    _repeated(inst, inner, renv, env, bufs, written, {}))
            if inner.call_returns is not None:  # no event is queried: allowed in a capture
                late.append(contract.call_returned(f"capture {step.handle}", inner, work))
            if work is not None and inner.handle:
                works[inner.handle] = work
            elif work is not None:
                work.wait()

        graphs.capture(step, run_inner)


def _special(step: Step) -> None:
    if step.kind == "sleep":
        time.sleep(float(step.value))
    elif step.kind == "sync":
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
    elif step.kind == "raise":
        raise RuntimeError(str(step.value))
    elif step.kind == "abort":
        os.abort()
    elif step.kind == "exit":
        os._exit(int(step.value))
    elif step.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif step.kind == "stall":
        while True:  # answers nothing, dies only when the harness ends it
            time.sleep(3600)
    elif step.kind == "segfault":
        import ctypes

        ctypes.string_at(0)  # a real SIGSEGV, to show how the harness reports one


def _magnitude(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return torch.complex(t.real.abs(), t.imag.abs())
    return t.abs()


def _outside_group(inst: Instance, rank: int) -> bool:
    """Whether the ``op:`` form's op runs on a group that ``rank`` is not a member of."""
    group = dict(inst.steps[0].args).get("group") if inst.shorthand is not None else None
    return isinstance(group, tuple) and rank not in group


def _reference(inst: Instance, renv: RankEnv, env: dict[str, Any],
               magnitude: bool = False) -> Any:
    """The reference model's result for this rank; ``magnitude``: over every input's
    absolute values (for sums, the sum of |x| that bounds the rounding error)."""
    return _references(inst, renv, env, False, (magnitude,))[0]


def _references(inst: Instance, renv: RankEnv, env: dict[str, Any], wide: bool,
                kinds: tuple[bool, ...]) -> list[Any]:
    """The reference model's results for this rank, one per entry of ``kinds`` (True: over
    every input's absolute values), the inputs built once; ``wide``: the inputs in float64
    (integers too), so the results are unrounded (harness.program.fp64)."""
    assert inst.shorthand is not None
    op = ops.get(inst.op)
    in_spec = _spec(inst, inst.shorthand[0])
    out_spec = _spec(inst, inst.shorthand[1])
    inputs: list[Any] = []
    for r in range(renv.world_size):
        t = _materialize(inst, in_spec, r, renv.world_size, env)
        if wide:
            t = fp64.widened(t, integers=True)
        entries = in_spec.entries_for(r)
        inputs.append(t if entries is None else tensors.entry_views(t, entries))
    step = inst.steps[0]
    args = step_args(step, renv.rank, renv.world_size, env)
    group = args.pop("group", None)
    members = tuple(sorted(group)) if group else tuple(range(renv.world_size))
    stepchecks.group_addressing(args, members)
    ctx = ops.RefContext(world_size=renv.world_size, group_ranks=members,
                         reduce_op=inst.reduce_op,
                         args={**args, "premul_factor": inst.premul_factor},
                         out_shape=_shape(out_spec.shape_for(renv.rank)) or ())
    out: list[Any] = []
    for magnitude in kinds:
        given = [_magnitude(t) if isinstance(t, torch.Tensor) else [_magnitude(x) for x in t]
                 for t in inputs] if magnitude else inputs
        result = op.reference(given, ctx)[renv.rank]
        if out_spec.entries_for(renv.rank) is not None and result is not None:
            result = tensors.flatten_entries(result)
        out.append(result)
    return out


def check_results(inst: Instance, renv: RankEnv, env: dict[str, Any], bufs: dict[str, Any],
                  before: dict[str, Any], written: set[str]) -> list[TensorCheck]:
    """Compare every buffer of this rank with its expectation (``before``: initial contents)."""
    checks: list[TensorCheck] = []
    declared = dict(inst.expected)
    for spec in inst.tensors:
        got = bufs[spec.name]
        fill: Fill = declared.get(spec.name, Fill("unspecified")).for_rank(renv.rank)
        how: str = fill.kind
        exp: Any
        wide: list[Any] = []
        if fill.kind == "auto" and _outside_group(inst, renv.rank):
            # The op never ran here: the buffers must come back untouched (below), and the
            # reference model need not run (it may reject what the backend rejected too).
            exp = None
        elif fill.kind == "auto":
            # Float data: the FP64 reference, computed once, gives the expected value too
            # (the model reduces in float64 and rounds once either way).
            wide = (_references(inst, renv, env, True, fp64.kinds(inst, got))
                    if spec.dtype != "object" and isinstance(got, torch.Tensor) else [])
            exp = (wide[0].to(got.dtype) if wide and fp64.floating(got)
                   and isinstance(wide[0], torch.Tensor) else _reference(inst, renv, env))
            how = "auto"
        elif fill.kind == "unchanged":
            exp = before[spec.name]
        elif fill.kind == "unspecified":
            exp = None
        elif fill.kind == "same_values":
            other = fill.data[0]  # its own tolerance is applied below
            exp, how = bufs[other], f"same values as {other!r}"
        elif spec.dtype == "object":
            exp = _materialize(inst, spec, renv.rank, renv.world_size, env, fill)
            how = "explicit" if fill.kind == "list" else fill.kind
        else:
            exp = tensors.materialize(fill, tuple(got.shape), got.dtype, renv.rank,
                                      renv.world_size, env, inst.reduce_op,
                                      spec.entries_for(renv.rank))
            how = "explicit" if fill.kind == "list" else fill.kind
        if exp is None and spec.name not in written:
            # No op on this rank may write it (only read, or never handed over): whatever the
            # case says, it must come back bit for bit as it was.
            exp, how = before[spec.name], "untouched"
        if exp is None:
            if _must_agree(inst, spec.name) or _compared(inst, spec.name):
                # no expected value, but a digest to compare
                checks.append(_prefixed(inst, _digest_only(spec.name, got), got))
            continue
        if spec.dtype == "object":
            checks.append(objects.compare(spec.name, got, exp, how))
        else:
            tol = inst.tolerance
            if fill.kind == "same_values" and fill.data[1] is not None:
                tol = fill.data[1]  # the comparison's own tolerance wins over the case's
            bound, tol_text = None, ""
            if tol is not None and tol.auto:
                tol, bound, tol_text = _auto_tolerance(inst, renv, env, how, got.dtype)
            if tol is None and how == "auto":
                slack = ops.reference_tolerance(inst.reduce_op, inst.group_size(renv.world_size),
                                                spec.dtype)
                tol = Tolerance(*slack) if slack else None
            checks.append(_prefixed(inst, tensors.compare(
                spec.name, got, exp.to(got.dtype), how, tol, bound, tol_text), got))
            if wide:
                fp64.annotate(checks[-1], got, exp.to(got.dtype), inst, *wide)
            if spec.sparse is not None and got.layout != torch.sparse_coo:
                checks[-1].ok = False  # the op must keep the buffer a sparse tensor
                checks[-1].note = (f"declared sparse_coo, came back {got.layout}; "
                                   + checks[-1].note).rstrip("; ")
    return checks



def _auto_tolerance(inst: Instance, renv: RankEnv, env: dict[str, Any], how: str,
                    dtype: torch.dtype) -> tuple[Tolerance | None, Any, str]:
    """``tolerance: auto``: (tolerance, per-element bound, description).

    For ``expected: auto`` of an order-sensitive reduction over n ranks in a float dtype with
    unit roundoff u: every summation order's result lies within gamma_k * sum|x_i| of the
    exact sum (Higham's bound, gamma_k = k*u / (1 - k*u), k = n - 1 roundings, n with a
    scaling as in avg and premul_sum), plus 2 ulp for the rounding of the reference and of
    a final scaling. Anything else (min/max, data movement, integers) stays exact; where no
    reference exists (explicit expectations) it allows 2 ulp per rank.
    """
    n = inst.group_size(renv.world_size)
    if not (dtype.is_floating_point or dtype.is_complex) or how in ("unchanged", "untouched"):
        return None, None, ""  # integers, and buffers that must come back as they were
    if how != "auto" or inst.shorthand is None:
        return Tolerance(ulp=2.0 * n), None, f"tolerance auto: {2 * n} ulp (no reference)"
    if inst.reduce_op not in ORDER_SENSITIVE or not ops.get(inst.op).reduces:
        return None, None, ""
    mag = _reference(inst, renv, env, magnitude=True).to(torch.complex128 if dtype.is_complex
                                                         else torch.float64).abs()
    exp = _reference(inst, renv, env)
    order = fp64.summation_bound(inst, dtype, mag, exp, n)
    return None, order.bound, (f"tolerance auto: {order.roundings} rounding(s) over {n} ranks "
                               f"in {str(dtype).removeprefix('torch.')} (|error| <= "
                               f"{order.gamma:.3g} x sum|x| + 2 ulp)")


def _must_agree(inst: Instance, name: str) -> bool:
    return inst.shorthand is not None and inst.shorthand[1] == name and ops.get(inst.op).agree


def _compared(inst: Instance, name: str) -> bool:
    """Whether a property compares this buffer's bits (it needs a digest): ``same_bits`` with
    other buffers, or the extra runs of deterministic / iterations / offset, fusion and size
    invariance with this run, which hold for every written buffer, expected or not."""
    plan = inst.numerics
    if plan is None:
        return False
    return any(name in g for g in plan.same_bits) or plan.compares_runs()


def _prefixed(inst: Instance, check: TensorCheck, got: Any) -> TensorCheck:
    """``check`` with the digest of ``got``'s leading elements that size_invariant compares
    (``NumericsPlan.prefix``), when the instance asks for it."""
    if inst.numerics is not None and inst.numerics.prefix and isinstance(got, torch.Tensor):
        check.prefix_digest = tensors.digest(got.reshape(-1)[:inst.numerics.prefix])
    return check


def _digest_only(name: str, got: Any) -> TensorCheck:
    if isinstance(got, torch.Tensor):
        return TensorCheck(tensor=name, ok=True, expectation="unspecified",
                           total=got.numel(), digest=tensors.digest(got))
    return TensorCheck(tensor=name, ok=True, expectation="unspecified",
                       total=len(got) if isinstance(got, list) else 1,
                       digest=objects.digest(got))
