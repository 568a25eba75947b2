"""Single-tensor forms of the gathers and scatters: one flat buffer instead of a tensor list.

``all_gather_into_tensor``/``all_gather_single``, ``reduce_scatter_tensor``/
``reduce_scatter_single`` and ``gather_single``/``gather_into_tensor`` (torch 2.15) accept the
big buffer in two shapes: the ranks' chunks concatenated
along dim 0 (``form: concat``, the default) or stacked in a new dim 0 (``form: stack``).
``inplace: true`` passes the rank's own chunk of the big buffer as the small one (the aliasing
NCCL documents as the in-place form). ``all_to_all_single`` splits dim 0 evenly, or by
per-peer row counts (``splits``: a matrix ``splits[s][d]`` = rows member s sends to member d,
in group positions, given as an expression over ``src`` and ``dst`` or as a list of lists).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .base import (
    CallContext,
    Fuzzed,
    Op,
    PerRank,
    RefContext,
    Role,
    for_members,
    reduce_tensors,
)

if TYPE_CHECKING:
    import torch

FORMS = ("concat", "stack")


def _form(args: dict[str, Any] | None) -> str:
    form = str((args or {}).get("form", "concat"))
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    return form


def gathered_shape(in_shape: tuple[int, ...], world_size: int,
                   args: dict[str, Any] | None) -> tuple[int, ...]:
    """One chunk per rank: stacked in a new dim 0, or concatenated along dim 0 (the default)."""
    if _form(args) == "stack" or not in_shape:
        return (world_size, *in_shape)
    return (world_size * in_shape[0], *in_shape[1:])


def _chunk(big: Any, pos: int, small: Any, args: dict[str, Any]) -> Any:
    """Member ``pos``'s chunk of ``big`` (the gathered/scattered buffer) as a view."""
    if _form(args) == "stack" or big.dim() == small.dim() + 1:
        return big[pos]
    rows = small.shape[0]
    return big.narrow(0, pos * rows, rows)


def _pos(ctx: RefContext) -> dict[int, int]:
    return {g: i for i, g in enumerate(ctx.group_ranks)}


class _CopyAfterWait:
    """The Work of an in-place reduce-scatter: wait(), then copy the result chunk out."""

    def __init__(self, work: Any, dst: Any, src: Any) -> None:
        self.work, self.dst, self.src, self.done = work, dst, src, False

    def wait(self, timeout: Any = None) -> bool:
        self.work.wait() if timeout is None else self.work.wait(timeout)
        if not self.done:
            self.dst.copy_(self.src)
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done and bool(self.work.is_completed())


class _GatherSingle(Op):
    family = "all_gather"
    roles = (Role("output", "out"), Role("input", "in"))
    args = ("form", "inplace")
    in_role = "input"
    out_role = "output"
    agree = True
    bus = "ring"

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        return gathered_shape(in_shape, world_size, args)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        fn = getattr(ctx.dist, self.torch_name or self.name)
        out, inp = bufs["output"], bufs["input"]
        if ctx.args.get("inplace"):
            # In place: the input is this rank's own chunk of the output buffer.
            chunk = _chunk(out, ctx.group_ranks.index(ctx.rank), inp, ctx.args)
            if not ctx.timing:
                chunk.copy_(inp)
            inp = chunk
        return fn(out, inp, group=ctx.group, async_op=ctx.async_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        import torch

        out = torch.stack([inputs[g] for g in ctx.group_ranks]).reshape(ctx.out_shape)
        return for_members(out, ctx)


class AllGatherIntoTensor(_GatherSingle):
    name = "all_gather_into_tensor"
    recorded_as = ("_allgather_base_", "all_gather_into_tensor", "all_gather_into_tensor_out",
                   # coalesced: one call per tensor
                   "allgather_into_tensor_coalesced_", "all_gather_into_tensor_coalesced")
    fuzz = Fuzzed(4, "tensor", subgroup=True, inplace=True, offset=True)

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        out, inp = bufs["output"], bufs["input"]
        if args.get("inplace"):  # the input is our own chunk
            return lambda: dist.all_gather_into_tensor(out, out.chunk(world_size)[rank])
        return lambda: dist.all_gather_into_tensor(out, inp)


class AllGatherSingle(_GatherSingle):
    name = "all_gather_single"
    seen_from = "2.13"


class AllGatherBase(_GatherSingle):
    """``torch.distributed._all_gather_base``: the deprecated name of the single-tensor
    all-gather (it emits a FutureWarning; ``warns:`` can require it)."""

    name = "all_gather_base"
    torch_name = "_all_gather_base"


class _ReduceScatterSingle(Op):
    family = "reduce_scatter"
    roles = (Role("output", "out"), Role("input", "in"))
    args = ("form", "inplace")
    reduces = True
    in_role = "input"
    out_role = "output"
    bus = "ring"

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if not in_shape:
            raise ValueError("the input of a reduce-scatter needs at least one dimension")
        if _form(args) == "stack":
            return in_shape[1:]
        return (in_shape[0] // max(1, world_size), *in_shape[1:])

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        fn = getattr(ctx.dist, self.torch_name or self.name)
        out, inp = bufs["output"], bufs["input"]
        if not ctx.args.get("inplace"):
            return fn(out, inp, op=ctx.reduce_op, group=ctx.group, async_op=ctx.async_op)
        if ctx.timing:  # the documented in-place call itself, without the copies around it
            chunk = _chunk(inp, ctx.group_ranks.index(ctx.rank), out, ctx.args)
            return fn(chunk, inp, op=ctx.reduce_op, group=ctx.group, async_op=ctx.async_op)
        # In place: the output is this rank's chunk of (a scratch copy of) the input; the
        # case's output buffer receives that chunk afterwards, so it is checked as usual.
        scratch = inp.clone()
        chunk = _chunk(scratch, ctx.group_ranks.index(ctx.rank), out, ctx.args)
        work = fn(chunk, scratch, op=ctx.reduce_op, group=ctx.group, async_op=ctx.async_op)
        if work is None:
            out.copy_(chunk)
            return None
        return _CopyAfterWait(work, out, chunk)


    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        assert ctx.reduce_op is not None
        n = len(ctx.group_ranks)
        total = reduce_tensors([inputs[g] for g in ctx.group_ranks], ctx.reduce_op, ctx.args)
        chunks = total.reshape(n, *ctx.out_shape)
        pos = _pos(ctx)
        return [chunks[pos[r]] if r in pos else None for r in range(ctx.world_size)]


class ReduceScatterTensor(_ReduceScatterSingle):
    name = "reduce_scatter_tensor"
    recorded_as = ("_reduce_scatter_base_", "reduce_scatter_tensor", "reduce_scatter_tensor_out",
                   # coalesced: one call per tensor
                   "reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor_coalesced")
    fuzz = Fuzzed(8, "members", inplace=True)

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        out, inp = bufs["output"], bufs["input"]
        if args.get("inplace"):  # the output is our own chunk
            return lambda: dist.reduce_scatter_tensor(inp.chunk(world_size)[rank], inp,
                                                      op=reduce_op)
        return lambda: dist.reduce_scatter_tensor(out, inp, op=reduce_op)


class ReduceScatterSingle(_ReduceScatterSingle):
    name = "reduce_scatter_single"
    seen_from = "2.13"


class ReduceScatterBase(_ReduceScatterSingle):
    """``torch.distributed._reduce_scatter_base``: the deprecated name of the single-tensor
    reduce-scatter (it emits a FutureWarning; ``warns:`` can require it)."""

    name = "reduce_scatter_base"
    torch_name = "_reduce_scatter_base"


class _GatherIntoOne(Op):
    """``gather_single`` (torch 2.15) and its alias ``gather_into_tensor``: ``gather`` into one
    tensor on the destination. Only the output's element count is validated, so the flat
    (``form: concat``) and the stacked (``form: stack``) output are both documented forms;
    non-destination ranks pass no output."""

    family = "gather"
    roles = (Role("input", "in"), Role("output", "out", only="dst"))
    args = ("dst", "form")
    required_args = ("dst",)
    root_arg = "dst"
    in_role = "input"
    out_role = "output"
    seen_from = "2.15"

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        return gathered_shape(in_shape, world_size, args)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        fn = getattr(ctx.dist, self.name)
        return fn(bufs["input"], bufs["output"], dst=ctx.args["dst"], group=ctx.group,
                  async_op=ctx.async_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        import torch

        out = torch.stack([inputs[g] for g in ctx.group_ranks]).reshape(ctx.out_shape)
        # Elsewhere the output is never handed to the op: it keeps its poison ("unchanged").
        return [out if r == ctx.args["dst"] else None for r in range(ctx.world_size)]


class GatherSingle(_GatherIntoOne):
    name = "gather_single"


class GatherIntoTensor(_GatherIntoOne):
    name = "gather_into_tensor"


def split_matrix(args: dict[str, Any], n: int, rows: int) -> list[list[int]]:
    """``splits[s][d]``: rows group member s sends to member d (even: ``rows // n`` each)."""
    splits = args.get("splits")
    if splits is None:
        return [[rows // max(1, n)] * n for _ in range(n)]
    matrix = [list(map(int, row)) for row in splits]
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"splits must be a {n}x{n} matrix for a group of {n} rank(s)")
    return matrix


class AllToAllSingle(Op):
    name = "all_to_all_single"
    family = "all_to_all"
    roles = (Role("output", "out"), Role("input", "in"))
    args = ("splits",)
    in_role = "input"
    out_role = "output"
    bus = "ring"
    recorded_as = ("alltoall_base_", "all_to_all_single")
    fuzz = Fuzzed(10, "members")

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        out, inp = bufs["output"], bufs["input"]
        return lambda: dist.all_to_all_single(out, inp)

    def rank_shapes(self, in_shape: tuple[int, ...], world_size: int, args: dict[str, Any]
                    ) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
        if args.get("splits") is None:
            return None
        m = split_matrix(args, world_size, in_shape[0] if in_shape else 0)
        rest = in_shape[1:]
        return [((sum(m[r]), *rest), (sum(m[s][r] for s in range(world_size)), *rest))
                for r in range(world_size)]

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        out_splits = in_splits = None
        if ctx.args.get("splits") is not None:
            n = len(ctx.group_ranks)
            m = split_matrix(ctx.args, n, 0)
            me = ctx.group_ranks.index(ctx.rank)
            in_splits = m[me]
            out_splits = [m[s][me] for s in range(n)]
        return ctx.dist.all_to_all_single(bufs["output"], bufs["input"],
                                          output_split_sizes=out_splits,
                                          input_split_sizes=in_splits, group=ctx.group,
                                          async_op=ctx.async_op)

    def reference(self, inputs: Sequence[torch.Tensor], ctx: RefContext) -> PerRank:
        import torch

        members = ctx.group_ranks
        n = len(members)
        rows = inputs[members[0]].shape[0] if inputs[members[0]].dim() else 0
        m = split_matrix(ctx.args, n, rows)
        # Chunk d of member s's input goes to member d, stacked in sender order.
        chunks = {s: torch.split(inputs[g], m[s]) for s, g in enumerate(members)}
        pos = _pos(ctx)
        out: PerRank = []
        for r in range(ctx.world_size):
            if r not in pos:
                out.append(None)
                continue
            d = pos[r]
            out.append(torch.cat([chunks[s][d] for s in range(n)]))
        return out


OPS: tuple[Op, ...] = (AllGatherIntoTensor(), AllGatherSingle(), ReduceScatterTensor(),
                       ReduceScatterSingle(), AllToAllSingle(), GatherSingle(),
                       GatherIntoTensor(), AllGatherBase(), ReduceScatterBase())
