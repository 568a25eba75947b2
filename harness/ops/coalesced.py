"""Coalesced entries: several tensors in one call, and ``_coalescing_manager`` blocks.

The public coalesced APIs take lists of tensors; the case declares one tensor whose dim 0
enumerates the list (``all_gather_coalesced``'s output adds a leading dim per rank). The
``coalescing_manager_*`` entries run one collective per list entry inside
``torch.distributed._coalescing_manager`` (the private API FSDP and DDP use to batch
collectives), which the backend may fuse into one.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    reduce_entries,
    reduce_tensors,
)
from .p2p import WorkList

if TYPE_CHECKING:
    import torch


def _pos(ctx: RefContext) -> dict[int, int]:
    return {g: i for i, g in enumerate(ctx.group_ranks)}


def _all_reduce_ref(inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
    assert ctx.reduce_op is not None
    out = reduce_entries([inputs[g] for g in ctx.group_ranks], ctx.reduce_op, ctx.args)
    return [out if r in ctx.group_ranks else inputs[r] for r in range(ctx.world_size)]


def _same_list(entry: EntryShape, n: int, count: int) -> list[tuple[Layout, Layout]]:
    """In-place coalesced lists: every rank passes entries of the same shapes."""
    shapes = [entry(j, j) for j in range(count)]
    return [(list(shapes), list(shapes)) for _ in range(n)]


class FutureWork:
    """Adapts the torch.futures.Future that the public coalesced APIs return when
    ``async_op=True`` (their docs promise a work handle; a Future has no ``is_completed``)."""

    def __init__(self, fut: Any) -> None:
        self.fut = fut

    def wait(self, timeout: Any = None) -> bool:
        if timeout is not None:  # say so rather than wait without the bound
            raise NotImplementedError("a torch.futures.Future has no wait(timeout)")
        self.fut.wait()
        return True

    def is_completed(self) -> bool:
        return bool(self.fut.done())


def _as_work(handle: Any) -> Any:
    if handle is None or hasattr(handle, "is_completed"):
        return handle
    return FutureWork(handle)


class AllReduceCoalesced(Op):
    name = "all_reduce_coalesced"
    family = "coalesced"
    roles = (Role("tensors", "inout", form="list"),)
    in_role = out_role = "tensors"
    reduces = True
    agree = True
    bus = "all_reduce"
    entry_count_free = True
    unfused = "all_reduce"
    fuzz = Fuzzed(11, "entries")

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        return _same_list(entry, n, n if count is None else count)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return _as_work(ctx.dist.all_reduce_coalesced(bufs["tensors"], op=ctx.reduce_op,
                                                      group=ctx.group, async_op=ctx.async_op))

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        return _all_reduce_ref(inputs, ctx)


class AllGatherCoalesced(Op):
    name = "all_gather_coalesced"
    family = "coalesced"
    roles = (Role("output", "out", form="nested"), Role("input", "in", form="list"))
    in_role = "input"
    out_role = "output"
    agree = True
    bus = "ring"
    gathers = True
    entry_count_free = True
    fuzz: Fuzzed | None = Fuzzed(12, "entries")

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        # The output is n lists, each shaped like the input list (member order).
        shapes = [entry(j, j) for j in range(n if count is None else count)]
        return [(list(shapes), shapes * n) for _ in range(n)]

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return _as_work(ctx.dist.all_gather_coalesced(bufs["output"], bufs["input"],
                                                      group=ctx.group, async_op=ctx.async_op))

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        import torch

        members = [inputs[g] for g in ctx.group_ranks]
        if members and isinstance(members[0], list):  # entries of different shapes
            return for_members([e for m in members for e in m], ctx)
        return for_members(torch.stack(members), ctx)


class _Managed(Op):
    """One collective per list entry inside ``_coalescing_manager``."""

    family = "coalesced"
    torch_name = "_coalescing_manager"
    in_role = "input"
    out_role = "output"
    returns = "how many Works the coalescing manager holds (cm.works) after the block"

    def issue(self, ctx: CallContext, bufs: dict[str, Any], k: int) -> None:
        raise NotImplementedError

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        count = len(bufs[self.in_role])
        with ctx.dist._coalescing_manager(group=ctx.group, async_ops=ctx.async_op) as cm:
            for k in range(count):
                self.issue(ctx, bufs, k)
        ctx.returned["value"] = len(cm.works)
        return WorkList(list(cm.works)) if ctx.async_op else None


class CoalescingManagerAllReduce(_Managed):
    name = "coalescing_manager_all_reduce"
    roles = (Role("tensors", "inout", form="list"),)
    in_role = out_role = "tensors"
    reduces = True
    agree = True
    entry_count_free = True
    unfused = "all_reduce"

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        return _same_list(entry, n, n if count is None else count)

    def issue(self, ctx: CallContext, bufs: dict[str, Any], k: int) -> None:
        ctx.dist.all_reduce(bufs["tensors"][k], op=ctx.reduce_op, group=ctx.group)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        return _all_reduce_ref(inputs, ctx)


class CoalescingManagerAllGather(_Managed):
    """``all_gather_single`` of each list entry, concatenated form."""

    name = "coalescing_manager_all_gather"
    roles = (Role("output", "out", form="list"), Role("input", "in", form="list"))
    agree = True

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if len(in_shape) < 2:
            raise ValueError("the input needs shape [entries, n, ...]")
        return (in_shape[0], world_size * in_shape[1], *in_shape[2:])

    def issue(self, ctx: CallContext, bufs: dict[str, Any], k: int) -> None:
        fn = getattr(ctx.dist, "all_gather_single", None) or ctx.dist.all_gather_into_tensor
        fn(bufs["output"][k], bufs["input"][k], group=ctx.group)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        import torch

        out = torch.cat([inputs[g] for g in ctx.group_ranks], dim=1)
        return for_members(out, ctx)


class CoalescingManagerReduceScatter(_Managed):
    """``reduce_scatter_single`` of each list entry, concatenated form."""

    name = "coalescing_manager_reduce_scatter"
    roles = (Role("output", "out", form="list"), Role("input", "in", form="list"))
    reduces = True

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if len(in_shape) < 2:
            raise ValueError("the input needs shape [entries, world_size * n, ...]")
        return (in_shape[0], in_shape[1] // max(1, world_size), *in_shape[2:])

    def issue(self, ctx: CallContext, bufs: dict[str, Any], k: int) -> None:
        fn = getattr(ctx.dist, "reduce_scatter_single", None) or ctx.dist.reduce_scatter_tensor
        fn(bufs["output"][k], bufs["input"][k], op=ctx.reduce_op, group=ctx.group)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        assert ctx.reduce_op is not None
        n = len(ctx.group_ranks)
        total = reduce_tensors([inputs[g] for g in ctx.group_ranks], ctx.reduce_op, ctx.args)
        # [entries, n * m, ...] -> [entries, n, m, ...]: member p gets [:, p].
        chunks = total.reshape(total.shape[0], n, -1, *total.shape[2:])
        pos = _pos(ctx)
        return [chunks[:, pos[r]].reshape(ctx.out_shape) if r in pos else None
                for r in range(ctx.world_size)]


OPS: tuple[Op, ...] = (AllReduceCoalesced(), AllGatherCoalesced(), CoalescingManagerAllReduce(),
                       CoalescingManagerAllGather(), CoalescingManagerReduceScatter())
