"""Point-to-point entries: send/recv (blocking, or isend/irecv when the step is async)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .base import CallContext, Op, PerRank, RefContext, Role

if TYPE_CHECKING:
    import torch


class _P2P(Op):
    family = "p2p"
    in_role = "tensor"
    out_role = "tensor"

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        raise ValueError(f"{self.name} has no shorthand reference: write steps and expected "
                         "values per tensor")


class Send(_P2P):
    name = "send"
    roles = (Role("tensor", "in"),)
    args = ("dst", "tag")
    required_args = ("dst",)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        tag = int(ctx.args.get("tag", 0))
        if ctx.async_op:
            return ctx.dist.isend(bufs["tensor"], dst=ctx.args["dst"], group=ctx.group, tag=tag)
        ctx.dist.send(bufs["tensor"], dst=ctx.args["dst"], group=ctx.group, tag=tag)
        return None


class Recv(_P2P):
    name = "recv"
    roles = (Role("tensor", "out"),)
    args = ("src", "tag")
    required_args = ()  # no src: receive from any source (Gloo supports it; NCCL does not)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        tag = int(ctx.args.get("tag", 0))
        src = ctx.args.get("src")
        if ctx.async_op:
            return ctx.dist.irecv(bufs["tensor"], src=src, group=ctx.group, tag=tag)
        ctx.dist.recv(bufs["tensor"], src=src, group=ctx.group, tag=tag)
        return None


class ISend(Send):
    name = "isend"
    supports_async = True

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return super().call(_force_async(ctx), bufs)


class IRecv(Recv):
    name = "irecv"

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return super().call(_force_async(ctx), bufs)


def _force_async(ctx: CallContext) -> CallContext:
    from dataclasses import replace

    return replace(ctx, async_op=True)


OPS: tuple[Op, ...] = (Send(), Recv(), ISend(), IRecv())
