"""Recorded dispatcher ops -> the case format's ops.

Each recorded call (a ``c10d::*`` or ``_c10d_functional::*`` op with its arguments) becomes
zero or more :class:`Call` values in the vocabulary of the case files: the op's name in the
harness's op table, its group as global ranks, the input shape, dtype, reduce op, root or peer
(global), tag, and whether it was async. Ops the table lacks are returned as unknown, never
dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ops


@dataclass(frozen=True)
class Call:
    """One translated call on one rank."""

    op: str
    rank: int
    group: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    device: str
    layout: str  # "contiguous" or "strided" (non-contiguous input)
    reduce_op: str | None = None
    root: int | None = None  # global: src of broadcast/scatter, dst of reduce/gather
    peer: int | None = None  # global: dst of a send, src of a recv (None: any source)
    tag: int = 0
    async_op: bool = False
    form: str | None = None  # all_gather_into_tensor / reduce_scatter_tensor: concat, stack
    splits: tuple[int, ...] | None = None  # all_to_all_single: this rank's input splits
    site: str = "?"
    api: str | None = None
    seq: int = 0
    # where its Work was waited, when that was seen: (at site, after N later calls) -> times
    waits: tuple[tuple[str, int], ...] = ()
    count: int = 1  # identical calls it stands for (the trace counted the repeats)
    ordered: bool = True  # within the part of the trace kept in issue order
    # a group new_group made with every rank of the world: not the default group, though its
    # members are the same (a backend may treat it otherwise), so it is replayed as a group
    own_group: bool = False


class UnknownOp(Exception):
    """A recorded op this table cannot translate."""


def _t(args: dict[str, Any], name: str) -> dict[str, Any]:
    value = args[name]
    while isinstance(value, list):
        value = value[0]
    if not isinstance(value, dict) or "shape" not in value:
        raise UnknownOp(f"argument '{name}' holds no tensor")
    return value


def _pairs(args: dict[str, Any], outs: str, ins: str) -> list[tuple[Any, Any]]:
    return list(zip(args[outs], args[ins], strict=False))


def _form(inp: dict[str, Any], out: dict[str, Any]) -> str:
    return "stack" if len(out["shape"]) == len(inp["shape"]) + 1 else "concat"


def _group(rec: dict[str, Any]) -> tuple[int, ...]:
    return tuple(rec.get("group") or ())


def _local(group: tuple[int, ...], pos: Any) -> int | None:
    if type(pos) is not int or pos < 0:
        return None
    return group[pos] if pos < len(group) else pos


def _listed(rec: dict[str, Any], t: dict[str, Any]) -> dict[str, Any]:
    """An op whose input is a list of one entry per member: the case's shape is
    [members, *entry]."""
    return {**t, "shape": [len(rec.get("group") or ()), *t["shape"]]}


def _base(rec: dict[str, Any], rank: int, t: dict[str, Any], op: str, **kw: Any) -> Call:
    group = _group(rec)
    api = rec.get("api")
    async_op = rec["args"].get("async_op")
    if async_op is None:
        async_op = api in ops.ALWAYS_ASYNC
    if api is None and rec["op"].startswith("c10d::"):
        async_op = True  # issued from C++ (DDP's Reducer): waited there, after the call
    return Call(op=op, rank=rank, group=group, shape=tuple(t["shape"]), dtype=t["dtype"],
                device=t["device"], layout="contiguous" if t.get("contiguous", True)
                else "strided", reduce_op=rec.get("reduce_op"), async_op=bool(async_op),
                site=rec["site"], api=api, seq=rec["seq"],
                own_group=rec.get("own_group") is True, **kw)


Reader = Callable[[dict[str, Any], int, str], list[Call]]


def _each(first: str, second: str, root: bool = False, lists: bool = False) -> Reader:
    """One call per tensor under ``first``, or else ``second`` (one tensor or a list;
    ``lists``: always a list); ``root``: the root from ``root_rank`` (c10d) or ``src``."""
    def read(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
        args = rec["args"]
        key = first if first in args else second
        ts = args[key] if lists or isinstance(args[key], list) else [args[key]]
        kw: dict[str, Any] = {}
        if root:
            kw["root"] = _local(_group(rec), args.get("root_rank", args.get("src")))
        return [_base(rec, rank, t, op, **kw) for t in ts]
    return read


def _one(key: str, listed: bool = False, root: bool = False) -> Reader:
    """One call for the tensor under ``key``; ``listed``: a list of one entry per member."""
    def read(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
        t = _t(rec["args"], key)
        kw: dict[str, Any] = {}
        if root:
            kw["root"] = _local(_group(rec), rec["args"]["root_rank"])
        return [_base(rec, rank, _listed(rec, t) if listed else t, op, **kw)]
    return read


def _base_form(out_key: str, in_key: str, gathers: bool) -> Reader:
    """The c10d single-tensor gathers and reduce-scatters: the form from the two shapes."""
    def read(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
        inp, out = _t(rec["args"], in_key), _t(rec["args"], out_key)
        form = _form(inp, out) if gathers else _form(out, inp)
        return [_base(rec, rank, inp, op, form=form)]
    return read


def _coalesced_form(gathers: bool) -> Reader:
    """c10d's coalesced single-tensor ops: one call per (output, input) pair."""
    def read(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
        return [_base(rec, rank, i, op, form=_form(i, o) if gathers else _form(o, i))
                for o, i in _pairs(rec["args"], "outputs", "inputs")]
    return read


def _concat(key: str, many: bool = False) -> Reader:
    """The functional single-tensor ops, always the concatenated form."""
    def read(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
        ts = rec["args"][key] if many else [_t(rec["args"], key)]
        return [_base(rec, rank, t, op, form="concat") for t in ts]
    return read


def _all_to_all_single(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
    splits = tuple(rec["args"].get("input_split_sizes") or ()) or None
    return [_base(rec, rank, _t(rec["args"], "input"), op, splits=splits)]


def _barrier(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
    return [_base(rec, rank, {"shape": [], "dtype": "none", "device": "cpu"}, op)]


def _p2p(peer_key: str, any_source: bool = False) -> Reader:
    """send/recv: the peer from ``dst``/``src``; ``any_source``: a receive may have none."""
    def read(rec: dict[str, Any], rank: int, op: str) -> list[Call]:
        args = rec["args"]
        key = "tensors" if "tensors" in args else "tensor"
        has_peer = peer_key in args or not any_source
        peer = _local(_group(rec), args[peer_key]) if has_peer else None
        return [_base(rec, rank, _t(args, key), op, peer=peer, tag=args.get("tag", 0))]
    return read


# How to read each dispatcher op's arguments (its schema). Which case-format op a dispatcher
# op becomes is the op table's knowledge (``Op.recorded_as``).
READERS: dict[str, Reader] = {
    "allreduce_": _each("tensors", "input"),
    "all_reduce": _each("tensors", "input"),
    "all_reduce_": _each("tensors", "input"),
    "allreduce_coalesced_": _each("tensors", "inputs", lists=True),
    "all_reduce_coalesced": _each("tensors", "inputs", lists=True),
    "all_reduce_coalesced_": _each("tensors", "inputs", lists=True),
    "broadcast_": _each("tensors", "input", root=True),
    "broadcast": _each("tensors", "input", root=True),
    "reduce_": _one("tensors", root=True),
    "allgather_": _one("input_tensors"),
    "_allgather_base_": _base_form("output_tensor", "input_tensor", gathers=True),
    "allgather_into_tensor_coalesced_": _coalesced_form(gathers=True),
    "all_gather_into_tensor": _concat("input"),
    "all_gather_into_tensor_out": _concat("input"),
    "all_gather_into_tensor_coalesced": _concat("inputs", many=True),
    "reduce_scatter_": _one("output_tensors", listed=True),
    "_reduce_scatter_base_": _base_form("output_tensor", "input_tensor", gathers=False),
    "reduce_scatter_tensor_coalesced_": _coalesced_form(gathers=False),
    "reduce_scatter_tensor": _concat("input"),
    "reduce_scatter_tensor_out": _concat("input"),
    "reduce_scatter_tensor_coalesced": _concat("inputs", many=True),
    "alltoall_base_": _all_to_all_single,
    "all_to_all_single": _all_to_all_single,
    "alltoall_": _one("input_tensors", listed=True),
    "gather_": _one("input_tensors", root=True),
    "scatter_": _one("output_tensors", listed=True, root=True),
    "barrier": _barrier,
    "monitored_barrier_": _barrier,
    "send": _p2p("dst"),
    "isend": _p2p("dst"),
    "recv_": _p2p("src", any_source=True),
    "recv_any_source_": _p2p("src", any_source=True),
    "irecv": _p2p("src", any_source=True),
}
# Dispatcher op (without its namespace) -> the op table's op its calls are written as.
RECORDED: dict[str, str] = {name: op.name for op in ops.ALL_OPS.values()
                            for name in op.recorded_as}


def translate(rec: dict[str, Any], rank: int) -> list[Call]:
    """The case-format calls one recorded call stands for; raises UnknownOp."""
    op = rec["op"]
    name = op.split("::", 1)[1]
    target, read = RECORDED.get(name), READERS.get(name)
    if target is None or read is None:
        raise UnknownOp(f"{op} is not in the op table")
    try:
        return read(rec, rank, target)
    except (KeyError, IndexError, TypeError) as e:
        raise UnknownOp(f"{op}: arguments not as recorded by this version ({e!r})") from None


WAIT_OPS = {"_c10d_functional::wait_tensor"}
