"""The shape of an op entry: everything the harness knows about one op lives in one object.

An :class:`Op` says which buffers the op takes (its *roles*), which scalar arguments it
accepts, how to call it in a rank, what its result is (the reference model), and its
bus-bandwidth factor. Parent-side code reads only the plain attributes; ``call`` and
``reference`` run in rank processes and import torch lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .. import dtypes

if TYPE_CHECKING:
    import torch

Access = Literal["in", "out", "inout"]
Form = Literal["tensor", "list", "nested", "object", "objects"]
Only = Literal["all", "src", "dst", "root"]

# A value of None in a per-rank expectation list means "the contract leaves it unspecified".
# Object collectives put Python objects where tensors would be.
PerRank = list[Any]

# A buffer's layout in a case with per-entry shapes: one tensor shape, or a list of entry
# shapes (a Python list of tensors of different sizes, as all_gather_v passes).
Shape = tuple[int, ...]
Layout = Shape | list[Shape]
# entry_shape(s, j): the shape of list entry j; ``s`` is the sending member (all_to_all only).
EntryShape = Callable[[int, int], Shape]


@dataclass(frozen=True)
class Role:
    """A buffer an op takes.

    ``form="list"`` means the op takes a Python list of tensors: the case declares one tensor
    whose dim 0 has one entry per list element, and the harness passes ``list(t.unbind(0))``
    (views, so writes land in the case tensor). ``form="nested"`` is a list of such lists
    (dims 0 and 1; ``all_gather_coalesced``'s output). ``form="object"`` is one picklable
    Python object and ``form="objects"`` a Python list of them (the object collectives): their
    buffers are built from plain YAML data, not tensors (see :mod:`harness.program.objects`).
    ``only`` restricts the buffer to the root rank (``src``/``dst`` argument; ``root``: the
    group position ``root_rank`` of the process-group methods); other ranks pass None. A
    ``root`` buffer given in a step as a list of tensor names is passed as written on every
    rank (the case says what each rank hands over).
    """

    name: str
    access: Access
    form: Form = "tensor"
    only: Only = "all"


FuzzShape = Literal["tensor", "members", "entries", "none"]


@dataclass(frozen=True)
class Fuzzed:
    """How ``collective-fuzz`` draws an op in the ``op:`` form (:mod:`harness.fuzz.space`).

    ``order`` places the op among the fuzzed ops: Hypothesis draws an op by its index and
    shrinks toward index 0, so a lower order is the simpler choice, and the order fixes which
    documents a seed gives. ``shape`` says what the case's ``shape`` is made of: ``tensor``
    the drawn element shape itself, ``members`` one element per group member in dim 0,
    ``entries`` a list of 1-4 elements in dim 0 (the coalesced ops), ``none`` no buffer.
    The flags allow the rarer corners: a drawn subgroup (``args: {group: ...}``),
    ``inplace: true``, and a buffer ``offset:``.
    """

    order: int
    shape: FuzzShape
    subgroup: bool = False
    inplace: bool = False
    offset: bool = False


@dataclass(frozen=True)
class CallContext:
    """What a rank passes to :meth:`Op.call`: resolved arguments and runtime handles."""

    dist: Any  # the torch.distributed module
    rank: int
    world_size: int
    group: Any  # a ProcessGroup or None (the default group)
    group_ranks: tuple[int, ...]  # global ranks of the group, in group order
    reduce_op: Any  # a torch.distributed.ReduceOp (or premul-sum op) or None
    async_op: bool
    args: dict[str, Any]
    # In a --perf timing loop: the buffers' contents no longer matter, so an op may skip the
    # copies that only keep the case's buffers checkable and make the call torch documents.
    timing: bool = False
    # What the call returned that a case may check (``returns:``), filled by the op: the
    # value is recorded under "value" once known (after wait() for async calls).
    returned: dict[str, Any] = field(default_factory=dict)


class Op:
    """Base class of op entries. Subclasses set the class attributes and override methods."""

    name: str = ""
    family: str = ""  # groups ops in reports and case files
    roles: tuple[Role, ...] = ()
    args: tuple[str, ...] = ()  # scalar arguments a step may pass (besides group/async)
    required_args: tuple[str, ...] = ()
    # Arguments a case may leave out (``omit: [dst]``) so that torch's own default is what is
    # tested, each with the value torch documents for it (the harness's bookkeeping uses it:
    # root-only buffers, the reference model). ``reduce_op`` stands for the ``op=`` argument.
    defaults: tuple[tuple[str, Any], ...] = ()
    reduces: bool = False
    supports_async: bool = True
    torch_name: str = ""  # attribute of torch.distributed that must exist; default: name
    # Shorthand form (``op: X`` with ``input:``/``expected:``): which role gets ``input``
    # and which role ``expected`` describes. Equal for in-place ops.
    in_role: str = "tensor"
    out_role: str = "tensor"
    # Moves data between ranks by point-to-point messages matched by tag, outside the group's
    # collective sequence (send/recv, object send/recv, monitored_barrier): a message left
    # unreceived when a rank raised can be read by a later instance, which a health check of
    # collectives cannot see, so a pool is not reused after a raise in such an instance.
    point_to_point: bool = False
    # The out-role buffer must hold identical bytes on every member of the group after the op
    # (all_reduce, broadcast, all_gather...): the verdict compares the ranks' digests, which
    # catches a divergence even where the expectation is "unspecified" or has a tolerance.
    agree: bool = False
    # What ``returns:`` on a step of this op checks (docs/reference/programs.md); empty: the op
    # returns nothing a case can state.
    returns: str = ""
    # Its list may have any number of entries (``entries:``), not one per group member.
    entry_count_free: bool = False
    # Backends that implement the op at all (empty: any). Elsewhere instances skip.
    only_backends: tuple[str, ...] = ()
    # The oldest torch the harness has seen this op in, among the versions ci/torch-matrix.sh
    # ran (2.4.1, 2.13.0, 2.15.0); "" for an op every supported torch (2.4 on) has. "2.13"
    # means absent in 2.4.1 and present in 2.13.0: the release that added it is not known.
    # Where the installed torch lacks the op, its instances skip (see ``available``).
    seen_from: str = ""

    # nccl-tests' bus-bandwidth factor F(n), busbw = algbw * F(n): "all_reduce" is 2(n-1)/n,
    # "ring" (n-1)/n (gathers, reduce-scatters, all-to-all: bytes of the full buffer),
    # "one" 1 (broadcast, reduce, point-to-point).
    bus: Literal["one", "ring", "all_reduce"] = "one"
    # The output holds one chunk per group member: its shape is (group size, *input shape).
    gathers: bool = False
    # Ops addressed by a ``root_rank`` position (the process-group methods): True where the
    # root feeds the others (broadcast, scatter), False where it collects (reduce, gather).
    # The ordering probes delay the rank the others depend on.
    root_feeds: bool | None = None
    # The argument that names the root of a rooted collective: "src" where the root sends
    # (broadcast, scatter), "dst" where it receives (reduce, gather); "" for the others and for
    # point-to-point, whose src/dst name a peer.
    root_arg: str = ""
    # Always issued async whatever the case's ``async`` axis says: the name says so (isend,
    # irecv) or the call returns Works (batch_isend_irecv).
    always_async: bool = False
    # A step of the op lists its point-to-point ops under ``p2p:`` (batch_isend_irecv).
    p2p_entries: bool = False
    # ``entry_shape`` may depend on the sending member (``rank``) as well as on the entry:
    # each member sends chunks of its own sizes (all_to_all). Elsewhere every member passes
    # lists of the same entry shapes.
    entries_per_sender: bool = False
    # Output element i depends only on the inputs' element i, so its bits must not depend on
    # how many elements the buffer holds (``size_invariant``).
    elementwise: bool = False
    # For a coalesced op: the plain op its entries are issued with one by one, which must give
    # the same bits (``fusion_invariant``); "" where there is none.
    unfused: str = ""
    # Dispatcher ops (the name after ``c10d::`` or ``_c10d_functional::``) whose recorded calls
    # ``collective-record`` writes as calls of this op (harness.record.optable reads their
    # arguments). A coalesced dispatcher op becomes one call of this op per tensor.
    recorded_as: tuple[str, ...] = ()
    # How ``collective-fuzz`` generates the op in the ``op:`` form; None: it does not.
    fuzz: Fuzzed | None = None
    # Its :meth:`bare_call` posts the op and returns a Work (isend, irecv): a bare loop of such
    # calls issues them all, then waits them in the case's order. Other bare calls block.
    bare_posts: bool = False

    def bus_factor(self, world_size: int) -> float:
        """nccl-tests' bus-bandwidth factor: busbw = algbw * factor."""
        n = world_size
        return {"one": 1.0, "ring": (n - 1) / n, "all_reduce": 2 * (n - 1) / n}[self.bus]

    def out_shape(self, in_shape: tuple[int, ...], world_size: int,
                  args: dict[str, Any] | None = None) -> tuple[int, ...]:
        """Shape of the output buffer given the input buffer's shape (shorthand form).

        ``world_size`` is the size of the group the op runs on; ``args`` the resolved op
        arguments (``form: stack`` changes the output shape of the single-tensor gathers).
        """
        return (world_size, *in_shape) if self.gathers else in_shape

    def rank_shapes(self, in_shape: tuple[int, ...], world_size: int, args: dict[str, Any]
                    ) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
        """Per-rank (input, output) shapes when they differ between ranks, else None.

        Only ops whose buffers legitimately differ in size per rank (uneven
        ``all_to_all_single``) override this; indexed by position in the group.
        """
        return None

    def entry_layouts(self, entry: EntryShape, n: int, count: int | None = None
                      ) -> list[tuple[Layout, Layout]] | None:
        """Per group position, the (input, output) layouts when list entries differ in size.

        ``entry(s, j)`` is the case's ``entry_shape`` (the shape of the entry that belongs to
        group member ``j``; for all_to_all, of the chunk member ``s`` sends to ``j``). None:
        the op has no list buffer whose entries may differ (the case is rejected). ``count``
        is the case's ``entries`` (list length) for the coalesced ops, whose lists are not
        one entry per member; the collectives' lists always have ``n`` entries.
        """
        return None

    @property
    def takes_no_buffer(self) -> bool:
        """Whether a call passes no buffer at all (``barrier``): returning on every rank is
        all it lets anyone observe."""
        return not self.roles and not self.p2p_entries

    @property
    def takes_entry_shape(self) -> bool:
        """Whether a case may give this op's list entries different shapes (``entry_shape``)."""
        return self.entry_layouts(lambda s, j: (), 1) is not None

    def bare_call(self, dist: Any, bufs: dict[str, Any], args: dict[str, Any], reduce_op: Any,
                  rank: int, world_size: int) -> Callable[[], Any] | None:
        """The op as nccl-tests would call it: one plain ``torch.distributed`` call on the
        default group, with none of :meth:`call`'s bookkeeping (``collective-bench --busbw``
        times it next to the harness's call). None: the op has no bare form for ``args``.

        ``bufs`` maps role names to the step's tensors, ``args`` holds the resolved op
        arguments, ``reduce_op`` is a ``torch.distributed.ReduceOp``; ``rank`` and
        ``world_size`` are global.
        """
        return None

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    def available(self, dist: Any) -> bool:
        """Whether the installed torch.distributed has this op."""
        return hasattr(dist, self.torch_name or self.name)

    def call(self, ctx: CallContext, bufs: dict[str, Any]) -> Any:
        """Invoke the op in a rank; return the Work for async calls (or None)."""
        raise NotImplementedError

    def reference(self, inputs: Sequence[Any], ctx: RefContext) -> PerRank:
        """Expected contents of the out-role buffer on every rank (shorthand form).

        ``inputs[r]`` is rank r's in-role buffer before the op (global rank index). Ranks
        outside the group get their pre-op buffer back ("unchanged" is checked for them).
        """
        raise NotImplementedError


@dataclass(frozen=True)
class RefContext:
    """Arguments the reference model needs, resolved for one instance."""

    world_size: int
    group_ranks: tuple[int, ...]
    reduce_op: str | None
    args: dict[str, Any]
    out_shape: tuple[int, ...]


def reference_tolerance(reduce_op: str | None, group_size: int, dtype: str
                        ) -> tuple[float, float] | None:
    """(atol, rtol) the contract allows between a result and the reference, or None (exact).

    Only AVG over a group whose size is not a power of two has slack: the backend may divide
    the sum, multiply it by the rounded reciprocal, or scale each contribution first, and
    those differ by up to 2 ulp (the tolerance nccl-tests uses for avg). Everything else the
    exact generators make bit-exact.
    """
    if reduce_op != "avg" or group_size & (group_size - 1) == 0:
        return None
    info = dtypes.DTYPES.get(dtype)
    if info is None or info.kind not in ("float", "float8", "complex"):
        return None
    return (0.0, 2.0 * 2.0 ** -(info.mantissa_bits - 1))


def for_members(value: Any, ctx: RefContext) -> PerRank:
    """``value`` on every member of the op's group, None (unspecified) on the other ranks."""
    return [value if r in ctx.group_ranks else None for r in range(ctx.world_size)]


def root_kw(ctx: CallContext, key: str) -> dict[str, Any]:
    """The root argument of a call: ``src=``/``dst=`` (a global rank), or ``group_src=``/
    ``group_dst=`` (its position in the group) when the case addresses ranks in the group."""
    if key in ctx.args.get("omit", ()):  # left out: torch's default applies
        return {}
    if ctx.args.get("addressing") == "group" and f"group_{key}" in ctx.args:
        return {f"group_{key}": int(ctx.args[f"group_{key}"])}
    return {key: ctx.args.get(key)}


def op_kw(ctx: CallContext) -> dict[str, Any]:
    """The ``op=`` argument of a reducing call, or nothing when the case omits it."""
    return {} if "reduce_op" in ctx.args.get("omit", ()) else {"op": ctx.reduce_op}


def stack_or_list(ts: Sequence[Any]) -> Any:
    """The entries stacked in a new dim 0, or a plain list when their shapes differ."""
    import torch

    if all(isinstance(t, torch.Tensor) for t in ts) and len({tuple(t.shape) for t in ts}) <= 1:
        return torch.stack(list(ts))
    return list(ts)


def reduce_entries(members: Sequence[Any], op: str, args: dict[str, Any]) -> Any:
    """:func:`reduce_tensors` of the members' buffers; entry by entry for lists of entries."""
    if members and isinstance(members[0], list):
        return [reduce_tensors([m[j] for m in members], op, args)
                for j in range(len(members[0]))]
    return reduce_tensors(members, op, args)


def reduce_tensors(tensors: Sequence[torch.Tensor], op: str, args: dict[str, Any]) -> torch.Tensor:
    """Reduce ``tensors`` elementwise with ``op`` in a wide type, then cast back.

    Integer arithmetic is done in int64 and truncated, which reproduces wrap-around in narrow
    types; floats in float64/complex128, which is exact for the harness's exact generators
    (any reduction order gives the same bits) and the single correctly rounded value otherwise.
    """
    import torch

    dtype = tensors[0].dtype
    if dtype == torch.bool:
        stacked = torch.stack([t for t in tensors])
        if op in ("sum", "max", "bor", "bxor"):
            if op == "bxor":
                return (stacked.to(torch.int64).sum(0) % 2).bool()
            return stacked.any(0)
        if op in ("product", "min", "band"):
            return stacked.all(0)
        raise ValueError(f"reduce op {op} has no meaning for bool")
    if dtype.is_complex:
        wide = torch.complex128
    elif dtype.is_floating_point:
        wide = torch.float64
    else:
        wide = torch.int64
    xs = [t.to(wide) for t in tensors]
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in ("sum", "avg", "premul_sum"):
            acc = acc + x
        elif op == "product":
            acc = acc * x
        elif op == "min":
            acc = torch.minimum(acc, x)
        elif op == "max":
            acc = torch.maximum(acc, x)
        elif op == "band":
            acc = acc & x
        elif op == "bor":
            acc = acc | x
        elif op == "bxor":
            acc = acc ^ x
        else:
            raise ValueError(f"unknown reduce op {op}")
    # Scale and divide complex values part by part: torch's complex-by-complex arithmetic
    # (what `z / n` becomes) is not correctly rounded, while every backend works on the pairs
    # of reals (view_as_real).
    parts = torch.view_as_real(acc) if acc.is_complex() else acc
    if op == "premul_sum":
        parts = parts * float(args.get("premul_factor", 2.0))
    if op == "avg":
        n = len(tensors)
        parts = parts / n if (dtype.is_floating_point or dtype.is_complex) else torch.div(
            parts, n, rounding_mode="trunc")
    acc = torch.view_as_complex(parts.contiguous()) if acc.is_complex() else parts
    return acc.to(dtype)
