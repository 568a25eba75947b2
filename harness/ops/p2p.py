"""Point-to-point entries: send/recv (blocking, or isend/irecv when the step is async), and
``batch_isend_irecv``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .base import CallContext, Op, PerRank, RefContext, Role, root_kw

if TYPE_CHECKING:
    import torch


class _P2P(Op):
    family = "p2p"
    point_to_point = True
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
    recorded_as: tuple[str, ...] = ("send", "isend")

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return self.issue(ctx, bufs, ctx.async_op)

    def issue(self, ctx: CallContext, bufs: dict[str, Any], async_op: bool) -> Any:
        tag = int(ctx.args.get("tag", 0))
        if async_op:
            return ctx.dist.isend(bufs["tensor"], **root_kw(ctx, "dst"), group=ctx.group,
                                  tag=tag)
        ctx.dist.send(bufs["tensor"], **root_kw(ctx, "dst"), group=ctx.group, tag=tag)
        return None


class Recv(_P2P):
    name = "recv"
    roles = (Role("tensor", "out"),)
    args = ("src", "tag")
    required_args = ()  # no src: receive from any source (Gloo supports it; NCCL does not)
    recorded_as: tuple[str, ...] = ("recv_", "recv_any_source_", "irecv")
    returns = ("the sender's global rank: what recv returns, or the irecv Work's "
               "_source_rank() after wait()")

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return self.issue(ctx, bufs, ctx.async_op)

    def issue(self, ctx: CallContext, bufs: dict[str, Any], async_op: bool) -> Any:
        tag = int(ctx.args.get("tag", 0))
        src = root_kw(ctx, "src")
        if async_op:
            work = ctx.dist.irecv(bufs["tensor"], **src, group=ctx.group, tag=tag)
            # The sender is known once the Work is waited; asked only if a case checks it.
            ctx.returned["source_of"] = work
            return work
        ctx.returned["value"] = ctx.dist.recv(bufs["tensor"], **src, group=ctx.group,
                                              tag=tag)
        return None


class ISend(Send):
    name = "isend"
    supports_async = True
    always_async = True
    recorded_as = ()  # recorded isend calls are written as async sends
    bare_posts = True

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        t, dst = bufs["tensor"], args["dst"]
        return lambda: dist.isend(t, dst)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return self.issue(ctx, bufs, True)


class IRecv(Recv):
    name = "irecv"
    always_async = True
    recorded_as = ()  # recorded irecv calls are written as async receives
    bare_posts = True

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        t, src = bufs["tensor"], args["src"]
        return lambda: dist.irecv(t, src)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return self.issue(ctx, bufs, True)




class WorkList:
    """Several Works seen as one (what ``batch_isend_irecv`` returns, waited together)."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self, timeout: Any = None) -> bool:
        for w in self.works:
            w.wait() if timeout is None else w.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(bool(w.is_completed()) for w in self.works)


class BatchISendIRecv(Op):
    """``batch_isend_irecv`` of the step's ``p2p`` entries, submitted as one batch.

    A step lists its point-to-point ops under ``p2p:``; expansion turns entry ``k`` into the
    buffer role ``p2p.k`` (the tensor) and the arguments ``p2p.k.op`` (isend/irecv),
    ``p2p.k.peer`` (a global rank, possibly an expression) and ``p2p.k.tag``.
    """

    name = "batch_isend_irecv"
    family = "p2p"
    point_to_point = True
    always_async = True
    p2p_entries = True
    roles = ()
    in_role = ""
    out_role = ""
    returns = "how many Works batch_isend_irecv returned"

    def role(self, name: str) -> Role:
        if name.startswith("p2p."):
            return Role(name, "inout")
        raise KeyError(name)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        p2p_ops = []
        for key in sorted(bufs, key=lambda k: int(k.split(".")[1])):
            kind = ctx.args[f"{key}.op"]
            fn = {"isend": ctx.dist.isend, "irecv": ctx.dist.irecv}[kind]
            peer = int(ctx.args[f"{key}.peer"])
            tag = int(ctx.args.get(f"{key}.tag", 0))
            if ctx.args.get(f"{key}.by_group"):  # group_peer: a position in the group
                p2p_ops.append(ctx.dist.P2POp(fn, bufs[key], group=ctx.group, tag=tag,
                                              group_peer=peer))
            else:
                p2p_ops.append(ctx.dist.P2POp(fn, bufs[key], peer, group=ctx.group, tag=tag))
        works = list(ctx.dist.batch_isend_irecv(p2p_ops))
        ctx.returned["value"] = len(works)
        return WorkList(works)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        raise ValueError("batch_isend_irecv has no shorthand reference: write steps and "
                         "expected values per tensor")


OPS: tuple[Op, ...] = (Send(), Recv(), ISend(), IRecv(), BatchISendIRecv())
