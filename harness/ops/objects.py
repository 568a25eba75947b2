"""Entries for the object collectives: picklable Python objects instead of tensors.

Their buffers have ``form="object"`` (one object) or ``form="objects"`` (a Python list); the
case gives plain YAML data for them (see :mod:`harness.program.objects`). None of them is async.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import CallContext, Op, PerRank, RefContext, Role, for_members, root_kw


def _pos(ctx: RefContext) -> dict[int, int]:
    return {g: i for i, g in enumerate(ctx.group_ranks)}


class _ObjectOp(Op):
    family = "objects"
    supports_async = False


class BroadcastObjectList(_ObjectOp):
    name = "broadcast_object_list"
    roles = (Role("objects", "inout", form="objects"),)
    args = ("src",)
    required_args = ("src",)
    root_arg = "src"
    in_role = out_role = "objects"
    agree = True

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        ctx.dist.broadcast_object_list(bufs["objects"], **root_kw(ctx, "src"), group=ctx.group)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        src = inputs[ctx.args["src"]]
        return [src if r in ctx.group_ranks else inputs[r] for r in range(ctx.world_size)]


class AllGatherObject(_ObjectOp):
    name = "all_gather_object"
    roles = (Role("output", "out", form="objects"), Role("input", "in", form="object"))
    in_role = "input"
    out_role = "output"
    agree = True

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        return (world_size,)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        ctx.dist.all_gather_object(bufs["output"], bufs["input"], group=ctx.group)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        out = [inputs[g] for g in ctx.group_ranks]
        return for_members(out, ctx)


class GatherObject(_ObjectOp):
    name = "gather_object"
    roles = (Role("input", "in", form="object"),
             Role("output", "out", form="objects", only="dst"))
    args = ("dst",)
    required_args = ("dst",)
    root_arg = "dst"
    in_role = "input"
    out_role = "output"

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        return (world_size,)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        ctx.dist.gather_object(bufs["input"], bufs["output"], **root_kw(ctx, "dst"),
                               group=ctx.group)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        out = [inputs[g] for g in ctx.group_ranks]
        return [out if r == ctx.args["dst"] else None for r in range(ctx.world_size)]


class ScatterObjectList(_ObjectOp):
    """Rank ``src`` scatters its list; every member's output list gets its entry in slot 0."""

    name = "scatter_object_list"
    roles = (Role("output", "out", form="objects"),
             Role("input", "in", form="objects", only="src"))
    args = ("src",)
    required_args = ("src",)
    root_arg = "src"
    in_role = "input"
    out_role = "output"

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        return (1,)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        ctx.dist.scatter_object_list(bufs["output"], bufs["input"], **root_kw(ctx, "src"),
                                     group=ctx.group)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        src = inputs[ctx.args["src"]]
        pos = _pos(ctx)
        return [[src[pos[r]]] if r in pos else None for r in range(ctx.world_size)]


class SendObjectList(_ObjectOp):
    name = "send_object_list"
    point_to_point = True
    roles = (Role("objects", "in", form="objects"),)
    args = ("dst",)
    required_args = ("dst",)
    in_role = out_role = "objects"

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        ctx.dist.send_object_list(bufs["objects"], **root_kw(ctx, "dst"), group=ctx.group)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        raise ValueError("send_object_list has no shorthand reference: write steps")


class RecvObjectList(_ObjectOp):
    name = "recv_object_list"
    point_to_point = True
    roles = (Role("objects", "out", form="objects"),)
    args = ("src",)
    in_role = out_role = "objects"

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        ctx.dist.recv_object_list(bufs["objects"], **root_kw(ctx, "src"), group=ctx.group)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        raise ValueError("recv_object_list has no shorthand reference: write steps")


OPS: tuple[Op, ...] = (BroadcastObjectList(), AllGatherObject(), GatherObject(),
                       ScatterObjectList(), SendObjectList(), RecvObjectList())
