"""The process-group methods: ``pg.allreduce([t1, t2], AllreduceOptions())`` and the like.

PyTorch's own tests call the methods of a process group object directly, with several tensors
per rank and an options object (``BroadcastOptions(rootRank, rootTensor)``), not the public
``torch.distributed`` functions the other entries call. These entries do the same, named
``pg.<method>`` after the method they call:

- on the ProcessGroup object (``via: group``, the default; ``dist.group.WORLD`` or the case's
  subgroup), which dispatches to the backend as every public function does; or
- on the backend object itself (``via: backend``: ``group._get_backend(device)``, what
  ``c10d.ProcessGroupGloo(store, rank, size, opts)`` is in ProcessGroupGlooTest). Gloo's own
  input checks for an empty list are reached only this way: through the ProcessGroup the
  dispatcher rejects a call without tensors first ("There were no tensor arguments").

Arguments (op arguments of a case or step): ``root_rank`` and ``root_tensor`` (the options'
``rootRank``, a position in the group, and ``rootTensor``; torch's defaults 0 when not
given, and passed through unchecked so that torch's own checks are what is tested), the
case's reduce op (the options' ``reduceOp``), and ``options``: ``object`` (default, an
options object), ``int`` (the root rank passed where the options object belongs, which
pybind rejects: "incompatible function arguments") or ``overload`` (the convenience overload
of one tensor and a root: ``pg.broadcast(tensor, root)``, ``pg.reduce(tensor, root, op)``).

The methods return a Work on every backend; a sync instance waits on it at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import (
    CallContext,
    EntryShape,
    Layout,
    Op,
    PerRank,
    RefContext,
    Role,
    for_members,
    op_kw,
    reduce_tensors,
    stack_or_list,
)
from .coalesced import AllGatherCoalesced


def _tensors(value: Any) -> list[Any]:
    """Every tensor of a (nested) list buffer, in order."""
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return [] if value is None else [value]


def _target(ctx: CallContext, bufs: dict[str, Any]) -> Any:
    """The object whose method is called: the ProcessGroup, or its backend (``via``)."""
    group = ctx.group if ctx.group is not None else ctx.dist.group.WORLD
    if ctx.args.get("via", "group") != "backend":
        return group
    import torch

    found = [t for v in bufs.values() for t in _tensors(v)]
    if found:
        device = found[0].device
    else:  # only empty lists: the backend's own device type
        device = torch.device("cuda" if ctx.dist.get_backend(group) == "nccl" else "cpu")
    return group._get_backend(device)


def _options(ctx: CallContext, kind: str, root: bool = False) -> Any:
    """An options object of ``torch.distributed.<kind>``; fields only where the case sets
    them, so an unset root keeps torch's default."""
    # AllgatherOptions is not re-exported by torch.distributed (torch 2.13); the C module
    # holds every options class.
    opts = getattr(ctx.dist.distributed_c10d, kind)()
    if ctx.reduce_op is not None:
        opts.reduceOp = ctx.reduce_op
    if root and "root_rank" in ctx.args:
        opts.rootRank = int(ctx.args["root_rank"])
    if root and "root_tensor" in ctx.args and hasattr(opts, "rootTensor"):
        opts.rootTensor = int(ctx.args["root_tensor"])
    return opts


def _finish(ctx: CallContext, work: Any) -> Any:
    if ctx.async_op:
        return work
    work.wait()
    return None


def _entries(value: Any) -> list[Any]:
    """A rank's list buffer as a list of entries (dim 0 of a stacked tensor, or the list)."""
    return list(value) if isinstance(value, list) else list(value.unbind(0))


def _root_tensor(ctx: RefContext, entries: list[Any]) -> int:
    """``root_tensor`` as an index into the root's list (checked: torch was not asked)."""
    k = int(ctx.args.get("root_tensor", 0))
    if not 0 <= k < len(entries):
        raise ValueError(f"root_tensor {k} is outside the root's list of {len(entries)}: "
                         "expected: auto has no result; state what the backend does "
                         "(raises:)")
    return k


def _root(ctx: RefContext) -> int:
    """The global rank of the root (``root_rank`` is a position in the group)."""
    pos = int(ctx.args.get("root_rank", 0))
    if not 0 <= pos < len(ctx.group_ranks):
        raise ValueError(f"root_rank {pos} is outside the group of {len(ctx.group_ranks)}: "
                         "expected: auto has no result; state what the backend does "
                         "(raises:)")
    return ctx.group_ranks[pos]


class _PgOp(Op):
    """Common parts: the method name, availability, the arguments every entry takes."""

    family = "pg_api"
    method = ""
    options_kind = ""  # the options class of the method
    options_forms: tuple[str, ...] = ("object",)

    def __init__(self) -> None:
        self.name = f"pg.{self.method}"
        self.torch_name = f"ProcessGroup.{self.method}"

    def available(self, dist: Any) -> bool:
        return hasattr(getattr(dist, "ProcessGroup", None), self.method)

    def invoke(self, ctx: CallContext, bufs: dict[str, Any], *lists: Any,
               root: bool = False) -> Any:
        """Call the method with ``lists`` and the options (or the int) the case asks for."""
        fn = getattr(_target(ctx, bufs), self.method)
        form = ctx.args.get("options", "object")
        if form == "int":
            return _finish(ctx, fn(*lists, int(ctx.args.get("root_rank", 0))))
        return _finish(ctx, fn(*lists, _options(ctx, self.options_kind, root)))


class PgAllreduce(_PgOp):
    method = "allreduce"
    options_kind = "AllreduceOptions"
    options_forms = ("object", "overload")
    roles = (Role("tensors", "inout", form="list"),)
    in_role = out_role = "tensors"
    args = ("via", "options")
    # The one-tensor overload ``pg.allreduce(x, op=SUM)``: upstream checks its default.
    defaults = (("reduce_op", "sum"),)
    reduces = True
    agree = True
    bus = "all_reduce"
    entry_count_free = True

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        if ctx.args.get("options") == "overload":  # pg.allreduce(tensor[, op])
            fn = _target(ctx, bufs).allreduce
            return _finish(ctx, fn(bufs["tensors"][0], **op_kw(ctx)))
        if "reduce_op" in ctx.args.get("omit", ()):
            raise ValueError("pg.allreduce can omit the reduce op only in the one-tensor "
                             "overload (options: overload)")
        return self.invoke(ctx, bufs, bufs["tensors"])

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        """Every entry of every member reduced into one value; every entry gets it."""
        assert ctx.reduce_op is not None
        mine = [_entries(inputs[g]) for g in ctx.group_ranks]
        total = reduce_tensors([e for m in mine for e in m], ctx.reduce_op, ctx.args)
        return [stack_or_list([total] * len(mine[0])) if r in ctx.group_ranks else inputs[r]
                for r in range(ctx.world_size)]


class PgBroadcast(_PgOp):
    method = "broadcast"
    root_feeds = True
    options_kind = "BroadcastOptions"
    options_forms = ("object", "overload")
    roles = (Role("tensors", "inout", form="list"),)
    in_role = out_role = "tensors"
    args = ("root_rank", "root_tensor", "via", "options")
    agree = True
    entry_count_free = True

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        if ctx.args.get("options") == "overload":  # pg.broadcast(tensor, root)
            fn = _target(ctx, bufs).broadcast
            return _finish(ctx, fn(bufs["tensors"][0], int(ctx.args.get("root_rank", 0))))
        return self.invoke(ctx, bufs, bufs["tensors"], root=True)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        """Entry ``root_tensor`` of the root's list, in every entry of every member."""
        mine = _entries(inputs[_root(ctx)])
        src = mine[_root_tensor(ctx, mine)]
        return [stack_or_list([src] * len(_entries(inputs[r]))) if r in ctx.group_ranks
                else inputs[r] for r in range(ctx.world_size)]


class PgReduce(_PgOp):
    method = "reduce"
    root_feeds = False
    options_kind = "ReduceOptions"
    options_forms = ("object", "overload")
    roles = (Role("tensors", "inout", form="list"),)
    in_role = out_role = "tensors"
    args = ("root_rank", "root_tensor", "via", "options")
    reduces = True
    entry_count_free = True

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        if ctx.args.get("options") == "overload":  # pg.reduce(tensor, root, op)
            fn = _target(ctx, bufs).reduce
            return _finish(ctx, fn(bufs["tensors"][0], int(ctx.args.get("root_rank", 0)),
                                   ctx.reduce_op))
        return self.invoke(ctx, bufs, bufs["tensors"], root=True)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        """On the root, entry ``root_tensor`` is the members' reduction of that entry and the
        other entries keep their input; elsewhere the contract says nothing."""
        assert ctx.reduce_op is not None
        root = _root(ctx)
        out = _entries(inputs[root])
        k = _root_tensor(ctx, out)
        out[k] = reduce_tensors([_entries(inputs[g])[k] for g in ctx.group_ranks],
                                ctx.reduce_op, ctx.args)
        return [stack_or_list(out) if r == root else
                None if r in ctx.group_ranks else inputs[r] for r in range(ctx.world_size)]


class PgAllgather(_PgOp):
    """``pg.allgather(output_lists, inputs)``: n inputs per rank, n output lists of n x group
    size entries; member m's input i lands at index n * m + i of every output list."""

    method = "allgather"
    options_kind = "AllgatherOptions"
    roles = (Role("output", "out", form="nested"), Role("input", "in", form="list"))
    in_role = "input"
    out_role = "output"
    args = ("via", "options")
    agree = True
    bus = "ring"
    entry_count_free = True

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if not in_shape:
            raise ValueError("the input needs shape [tensors per rank, ...]")
        return (in_shape[0], in_shape[0] * world_size, *in_shape[1:])

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return self.invoke(ctx, bufs, bufs["output"], bufs["input"])

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        import torch

        flat = [e for g in ctx.group_ranks for e in _entries(inputs[g])]
        n = len(_entries(inputs[ctx.group_ranks[0]]))
        return for_members(torch.stack([torch.stack(flat)] * n), ctx)


class PgAllgatherCoalesced(AllGatherCoalesced):
    """``pg.allgather_coalesced(output_lists, input_list)``: as ``all_gather_coalesced``, the
    method of the process group."""

    name = "pg.allgather_coalesced"
    family = "pg_api"
    torch_name = "ProcessGroup.allgather_coalesced"
    args = ("via", "options")
    fuzz = None  # the fuzzer draws all_gather_coalesced, not the method

    def available(self, dist: Any) -> bool:
        return hasattr(getattr(dist, "ProcessGroup", None), "allgather_coalesced")

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        fn = _target(ctx, bufs).allgather_coalesced
        return _finish(ctx, fn(bufs["output"], bufs["input"],
                               _options(ctx, "AllgatherOptions")))


class PgGather(_PgOp):
    """``pg.gather(output_lists, inputs, GatherOptions)``: the root's output list i gets
    every member's input i. In the op: form only the root passes its output (the others an
    empty list, as upstream's non-roots do); a step passes what it names."""

    method = "gather"
    root_feeds = False
    options_kind = "GatherOptions"
    options_forms = ("object", "int")
    roles = (Role("output", "out", form="nested", only="root"), Role("input", "in", form="list"))
    in_role = "input"
    out_role = "output"
    args = ("root_rank", "via", "options")
    bus = "ring"

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if not in_shape:
            raise ValueError("the input needs shape [tensors per rank, ...]")
        return (in_shape[0], world_size, *in_shape[1:])

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        out = [] if bufs["output"] is None else bufs["output"]
        return self.invoke(ctx, bufs, out, bufs["input"], root=True)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        import torch

        root = _root(ctx)
        n = len(_entries(inputs[root]))
        out = torch.stack([torch.stack([_entries(inputs[g])[i] for g in ctx.group_ranks])
                           for i in range(n)])
        return [out if r == root else None for r in range(ctx.world_size)]


class PgScatter(_PgOp):
    """``pg.scatter(outputs, input_lists, ScatterOptions)``: output i of member m gets entry
    m of the root's input list i. In the op: form only the root passes its input lists."""

    method = "scatter"
    root_feeds = True
    options_kind = "ScatterOptions"
    options_forms = ("object", "int")
    roles = (Role("output", "out", form="list"), Role("input", "in", form="nested", only="root"))
    in_role = "input"
    out_role = "output"
    args = ("root_rank", "via", "options")
    bus = "ring"

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if len(in_shape) < 2 or in_shape[1] != world_size:
            raise ValueError("the input needs shape [tensors per rank, world_size, ...]")
        return (in_shape[0], *in_shape[2:])

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        inp = [] if bufs["input"] is None else bufs["input"]
        return self.invoke(ctx, bufs, bufs["output"], inp, root=True)

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        import torch

        lists = _entries(inputs[_root(ctx)])
        pos = {g: i for i, g in enumerate(ctx.group_ranks)}
        return [torch.stack([x[pos[r]] for x in lists]) if r in pos else None
                for r in range(ctx.world_size)]


def _big(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The shape n times longer in dim 0 (a 0-dim entry stays as it is: torch rejects it)."""
    return (shape[0] * n, *shape[1:]) if shape else shape


class PgAllgatherIntoTensorCoalesced(_PgOp):
    """``pg.allgather_into_tensor_coalesced(outputs, inputs)``: output i is the
    concatenation (dim 0) of every member's input i. Entries may differ in shape
    (``entry_shape`` gives input entry j's shape)."""

    method = "allgather_into_tensor_coalesced"
    options_kind = "AllgatherOptions"
    roles = (Role("output", "out", form="list"), Role("input", "in", form="list"))
    in_role = "input"
    out_role = "output"
    args = ("via", "options")
    agree = True
    bus = "ring"
    entry_count_free = True

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if len(in_shape) < 2:
            raise ValueError("the input needs shape [entries, n, ...]")
        return (in_shape[0], *_big(in_shape[1:], world_size))

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        small = [entry(j, j) for j in range(n if count is None else count)]
        return [(list(small), [_big(s, n) for s in small]) for _ in range(n)]

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return self.invoke(ctx, bufs, bufs["output"], bufs["input"])

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        import torch

        mine = [_entries(inputs[g]) for g in ctx.group_ranks]
        out = [torch.cat([m[i] for m in mine]) for i in range(len(mine[0]))]
        return for_members(stack_or_list(out), ctx)


class PgReduceScatterTensorCoalesced(_PgOp):
    """``pg.reduce_scatter_tensor_coalesced(outputs, inputs)``: output i of member m is chunk
    m (dim 0) of the members' reduction of input i. ``entry_shape`` gives output entry j's
    shape (the input entry is group size times longer in dim 0)."""

    method = "reduce_scatter_tensor_coalesced"
    options_kind = "ReduceScatterOptions"
    roles = (Role("output", "out", form="list"), Role("input", "in", form="list"))
    in_role = "input"
    out_role = "output"
    args = ("via", "options")
    reduces = True
    bus = "ring"
    entry_count_free = True

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        if len(in_shape) < 2 or in_shape[1] % max(1, world_size):
            raise ValueError("the input needs shape [entries, world_size * n, ...]")
        return (in_shape[0], in_shape[1] // max(1, world_size), *in_shape[2:])

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        small = [entry(j, j) for j in range(n if count is None else count)]
        return [([_big(s, n) for s in small], list(small)) for _ in range(n)]

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        return self.invoke(ctx, bufs, bufs["output"], bufs["input"])

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        assert ctx.reduce_op is not None
        mine = [_entries(inputs[g]) for g in ctx.group_ranks]
        n = len(ctx.group_ranks)
        totals = [reduce_tensors([m[i] for m in mine], ctx.reduce_op, ctx.args)
                  for i in range(len(mine[0]))]
        pos = {g: i for i, g in enumerate(ctx.group_ranks)}
        return [stack_or_list([t.chunk(n)[pos[r]] if t.shape[0] else t for t in totals])
                if r in pos else None for r in range(ctx.world_size)]


OPS: tuple[Op, ...] = (PgAllreduce(), PgBroadcast(), PgReduce(), PgAllgather(),
                       PgAllgatherCoalesced(), PgGather(), PgScatter(),
                       PgAllgatherIntoTensorCoalesced(), PgReduceScatterTensorCoalesced())
