"""Entries for the core collectives: one class per op, its call and its reference result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .base import (
    CallContext,
    EntryShape,
    Fuzzed,
    Layout,
    Op,
    PerRank,
    RefContext,
    Role,
    for_members,
    op_kw,
    reduce_entries,
    reduce_tensors,
    root_kw,
    stack_or_list,
)

if TYPE_CHECKING:
    import torch


def _members(inputs: Sequence[torch.Tensor], ctx: RefContext) -> list[torch.Tensor]:
    return [inputs[g] for g in ctx.group_ranks]


def _unchanged_outside(inputs: Sequence[torch.Tensor], ctx: RefContext,
                       inside: dict[int, torch.Tensor | None]) -> PerRank:
    return [inside[r] if r in inside else inputs[r] for r in range(ctx.world_size)]


class AllReduce(Op):
    name = "all_reduce"
    family = "all_reduce"
    roles = (Role("tensor", "inout"),)
    reduces = True
    defaults = (("reduce_op", "sum"),)
    agree = True
    bus = "all_reduce"
    elementwise = True
    recorded_as = ("allreduce_", "all_reduce", "all_reduce_",
                   # DDP's and the functional coalesced calls: one all_reduce per tensor
                   "allreduce_coalesced_", "all_reduce_coalesced", "all_reduce_coalesced_")
    fuzz = Fuzzed(0, "tensor", subgroup=True, offset=True)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.all_reduce(bufs["tensor"], **op_kw(ctx), group=ctx.group,
                                   async_op=ctx.async_op)

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        t = bufs["tensor"]
        return lambda: dist.all_reduce(t, op=reduce_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        assert ctx.reduce_op is not None
        out = reduce_tensors(_members(inputs, ctx), ctx.reduce_op, ctx.args)
        return _unchanged_outside(inputs, ctx, {g: out for g in ctx.group_ranks})


class Broadcast(Op):
    name = "broadcast"
    family = "broadcast"
    roles = (Role("tensor", "inout"),)
    args = ("src",)
    required_args = ("src",)
    root_arg = "src"
    agree = True
    recorded_as = ("broadcast_", "broadcast")
    fuzz = Fuzzed(1, "tensor", subgroup=True, offset=True)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.broadcast(bufs["tensor"], **root_kw(ctx, "src"), group=ctx.group,
                                  async_op=ctx.async_op)

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        t, src = bufs["tensor"], args.get("src", 0)
        return lambda: dist.broadcast(t, src=src)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        src = inputs[ctx.args["src"]]
        return _unchanged_outside(inputs, ctx, {g: src for g in ctx.group_ranks})


class Reduce(Op):
    name = "reduce"
    family = "reduce"
    roles = (Role("tensor", "inout"),)
    args = ("dst",)
    required_args = ("dst",)
    root_arg = "dst"
    reduces = True
    defaults = (("reduce_op", "sum"),)
    elementwise = True
    recorded_as = ("reduce_",)
    fuzz = Fuzzed(2, "tensor", subgroup=True)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.reduce(bufs["tensor"], **root_kw(ctx, "dst"), **op_kw(ctx),
                               group=ctx.group, async_op=ctx.async_op)

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        t, dst = bufs["tensor"], args.get("dst", 0)
        return lambda: dist.reduce(t, dst=dst, op=reduce_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        assert ctx.reduce_op is not None
        dst = ctx.args["dst"]
        out = reduce_tensors(_members(inputs, ctx), ctx.reduce_op, ctx.args)
        # Non-destination buffers are scratch space in the contract (NCCL may write them).
        inside: dict[int, torch.Tensor | None] = {g: None for g in ctx.group_ranks}
        inside[dst] = out
        return _unchanged_outside(inputs, ctx, inside)


class AllGather(Op):
    name = "all_gather"
    family = "all_gather"
    roles = (Role("output", "out", form="list"), Role("input", "in"))
    args = ("inplace",)
    in_role = "input"
    out_role = "output"
    agree = True
    bus = "ring"
    gathers = True
    recorded_as = ("allgather_",)
    fuzz = Fuzzed(3, "tensor", subgroup=True)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        out, inp = bufs["output"], bufs["input"]
        if ctx.args.get("inplace"):  # the input is this rank's own entry of the output list
            mine = out[ctx.group_ranks.index(ctx.rank)]
            mine.copy_(inp)
            inp = mine
        return ctx.dist.all_gather(out, inp, group=ctx.group, async_op=ctx.async_op)

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        # all_gather_v: member p contributes entry p's shape; every output list has them all.
        return [(entry(p, p), [entry(j, j) for j in range(n)]) for p in range(n)]

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        return for_members(stack_or_list(_members(inputs, ctx)), ctx)


class Gather(Op):
    name = "gather"
    family = "gather"
    roles = (Role("input", "in"), Role("output", "out", form="list", only="dst"))
    args = ("dst",)
    required_args = ("dst",)
    defaults = (("dst", 0),)  # "If both dst and group_dst are None, default is global rank 0"
    root_arg = "dst"
    in_role = "input"
    out_role = "output"
    gathers = True
    recorded_as = ("gather_",)
    fuzz = Fuzzed(5, "tensor", subgroup=True)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.gather(bufs["input"], gather_list=bufs["output"], **root_kw(ctx, "dst"),
                               group=ctx.group, async_op=ctx.async_op)

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        return [(entry(p, p), [entry(j, j) for j in range(n)]) for p in range(n)]

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        out = stack_or_list(_members(inputs, ctx))
        # Only the destination passes a gather list; elsewhere the output is never handed to
        # the op, so it must still hold its poison: the harness checks it as "unchanged".
        return [out if r == ctx.args["dst"] else None for r in range(ctx.world_size)]


class Scatter(Op):
    name = "scatter"
    family = "scatter"
    roles = (Role("output", "out"), Role("input", "in", form="list", only="src"))
    args = ("src",)
    required_args = ("src",)
    defaults = (("src", 0),)  # "If both src and group_src are None, default is global rank 0"
    root_arg = "src"
    in_role = "input"
    out_role = "output"
    recorded_as = ("scatter_",)
    fuzz = Fuzzed(6, "members", subgroup=True)

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        return in_shape[1:]

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        return [([entry(j, j) for j in range(n)], entry(p, p)) for p in range(n)]

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.scatter(bufs["output"], scatter_list=bufs["input"], **root_kw(ctx, "src"),
                                group=ctx.group, async_op=ctx.async_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        src = inputs[ctx.args["src"]]
        pos = {g: i for i, g in enumerate(ctx.group_ranks)}
        return [src[pos[r]] if r in pos else None for r in range(ctx.world_size)]


class ReduceScatter(Op):
    name = "reduce_scatter"
    family = "reduce_scatter"
    roles = (Role("output", "out"), Role("input", "in", form="list"))
    reduces = True
    in_role = "input"
    out_role = "output"
    bus = "ring"
    recorded_as = ("reduce_scatter_",)
    fuzz = Fuzzed(7, "members")

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        return in_shape[1:]

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        # reduce_scatter_v: every rank passes the same list; member p receives entry p.
        return [([entry(j, j) for j in range(n)], entry(p, p)) for p in range(n)]

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.reduce_scatter(bufs["output"], bufs["input"], op=ctx.reduce_op,
                                       group=ctx.group, async_op=ctx.async_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        assert ctx.reduce_op is not None
        out = reduce_entries(_members(inputs, ctx), ctx.reduce_op, ctx.args)
        pos = {g: i for i, g in enumerate(ctx.group_ranks)}
        return [out[pos[r]] if r in pos else None for r in range(ctx.world_size)]


class AllToAll(Op):
    name = "all_to_all"
    family = "all_to_all"
    roles = (Role("output", "out", form="list"), Role("input", "in", form="list"))
    in_role = "input"
    out_role = "output"
    bus = "ring"
    entries_per_sender = True
    recorded_as = ("alltoall_",)
    fuzz = Fuzzed(9, "members")

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.all_to_all(bufs["output"], bufs["input"], group=ctx.group,
                                   async_op=ctx.async_op)

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        # Member p sends entry(p, d) to d and receives entry(s, p) from every s.
        return [([entry(p, d) for d in range(n)], [entry(s, p) for s in range(n)])
                for p in range(n)]

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        pos = {g: i for i, g in enumerate(ctx.group_ranks)}
        out: PerRank = []
        for r in range(ctx.world_size):
            if r not in pos:
                out.append(None)
                continue
            out.append(stack_or_list([inputs[g][pos[r]] for g in ctx.group_ranks]))
        return out


class Barrier(Op):
    """No buffers: passes when every rank returns (a missing rank shows up as a hang)."""

    name = "barrier"
    family = "barrier"
    roles = ()
    in_role = ""
    out_role = ""
    recorded_as = ("barrier",)
    fuzz = Fuzzed(13, "none", subgroup=True)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return ctx.dist.barrier(group=ctx.group, async_op=ctx.async_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        return [None] * ctx.world_size


class MonitoredBarrier(Op):
    """Gloo's barrier that names the ranks that did not arrive within ``timeout`` seconds."""

    name = "monitored_barrier"
    family = "barrier"
    point_to_point = True  # Gloo implements it with send/recv
    roles = ()
    args = ("timeout", "wait_all_ranks")
    supports_async = False
    in_role = ""
    out_role = ""
    only_backends = ("gloo",)
    recorded_as = ("monitored_barrier_",)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        import datetime

        timeout = ctx.args.get("timeout")
        ctx.dist.monitored_barrier(
            group=ctx.group,
            timeout=None if timeout is None else datetime.timedelta(seconds=float(timeout)),
            wait_all_ranks=bool(ctx.args.get("wait_all_ranks", False)))
        return None

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        return [None] * ctx.world_size


OPS: tuple[Op, ...] = (AllReduce(), Broadcast(), Reduce(), AllGather(), Gather(), Scatter(),
                       ReduceScatter(), AllToAll(), Barrier(), MonitoredBarrier())
