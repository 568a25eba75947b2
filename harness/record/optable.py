"""Recorded dispatcher ops -> the case format's ops.

Each recorded call (a ``c10d::*`` or ``_c10d_functional::*`` op with its arguments) becomes
zero or more :class:`Call` values in the vocabulary of the case files: the op's name in the
harness's op table, its group as global ranks, the input shape, dtype, reduce op, root or peer
(global), tag, and whether it was async. Ops the table lacks are returned as unknown, never
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    waited: str | None = None  # where the Work was waited, when it was seen


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


def _local(group: tuple[int, ...], pos: Any) -> int | None:
    if type(pos) is not int or pos < 0:
        return None
    return group[pos] if pos < len(group) else pos


def _listed(rec: dict[str, Any], t: dict[str, Any]) -> dict[str, Any]:
    """An op whose input is a list of one entry per member: the case's shape is
    [members, *entry]."""
    return {**t, "shape": [len(rec.get("group") or ()), *t["shape"]]}


def _base(rec: dict[str, Any], rank: int, t: dict[str, Any], op: str, **kw: Any) -> Call:
    group = tuple(rec.get("group") or ())
    api = rec.get("api")
    async_op = rec["args"].get("async_op")
    if async_op is None:
        async_op = api in {"isend", "irecv", "batch_isend_irecv"}
    if api is None and rec["op"].startswith("c10d::"):
        async_op = True  # issued from C++ (DDP's Reducer): waited there, after the call
    return Call(op=op, rank=rank, group=group, shape=tuple(t["shape"]), dtype=t["dtype"],
                device=t["device"], layout="contiguous" if t.get("contiguous", True)
                else "strided", reduce_op=rec.get("reduce_op"), async_op=bool(async_op),
                site=rec["site"], api=api, seq=rec["seq"], **kw)


def translate(rec: dict[str, Any], rank: int) -> list[Call]:
    """The case-format calls one recorded call stands for; raises UnknownOp."""
    op = rec["op"]
    args = rec["args"]
    group = tuple(rec.get("group") or ())
    name = op.split("::", 1)[1]
    try:
        if name in {"allreduce_", "all_reduce", "all_reduce_"}:
            key = "tensors" if "tensors" in args else "input"
            ts = args[key] if isinstance(args[key], list) else [args[key]]
            return [_base(rec, rank, t, "all_reduce") for t in ts]
        if name in {"allreduce_coalesced_", "all_reduce_coalesced", "all_reduce_coalesced_"}:
            key = "tensors" if "tensors" in args else "inputs"
            return [_base(rec, rank, t, "all_reduce") for t in args[key]]
        if name in {"broadcast_", "broadcast"}:
            key = "tensors" if "tensors" in args else "input"
            ts = args[key] if isinstance(args[key], list) else [args[key]]
            root = _local(group, args.get("root_rank", args.get("src")))
            return [_base(rec, rank, t, "broadcast", root=root) for t in ts]
        if name == "reduce_":
            return [_base(rec, rank, _t(args, "tensors"), "reduce",
                          root=_local(group, args["root_rank"]))]
        if name == "allgather_":
            return [_base(rec, rank, _t(args, "input_tensors"), "all_gather")]
        if name == "_allgather_base_":
            inp, out = _t(args, "input_tensor"), _t(args, "output_tensor")
            return [_base(rec, rank, inp, "all_gather_into_tensor", form=_form(inp, out))]
        if name == "allgather_into_tensor_coalesced_":
            return [_base(rec, rank, i, "all_gather_into_tensor", form=_form(i, o))
                    for o, i in _pairs(args, "outputs", "inputs")]
        if name in {"all_gather_into_tensor", "all_gather_into_tensor_out"}:
            return [_base(rec, rank, _t(args, "input"), "all_gather_into_tensor",
                          form="concat")]
        if name == "all_gather_into_tensor_coalesced":
            return [_base(rec, rank, t, "all_gather_into_tensor", form="concat")
                    for t in args["inputs"]]
        if name == "reduce_scatter_":
            return [_base(rec, rank, _listed(rec, _t(args, "output_tensors")),
                          "reduce_scatter")]
        if name == "_reduce_scatter_base_":
            inp, out = _t(args, "input_tensor"), _t(args, "output_tensor")
            return [_base(rec, rank, inp, "reduce_scatter_tensor", form=_form(out, inp))]
        if name == "reduce_scatter_tensor_coalesced_":
            return [_base(rec, rank, i, "reduce_scatter_tensor", form=_form(o, i))
                    for o, i in _pairs(args, "outputs", "inputs")]
        if name in {"reduce_scatter_tensor", "reduce_scatter_tensor_out"}:
            return [_base(rec, rank, _t(args, "input"), "reduce_scatter_tensor",
                          form="concat")]
        if name == "reduce_scatter_tensor_coalesced":
            return [_base(rec, rank, t, "reduce_scatter_tensor", form="concat")
                    for t in args["inputs"]]
        if name in {"alltoall_base_", "all_to_all_single"}:
            splits = tuple(args.get("input_split_sizes") or ()) or None
            return [_base(rec, rank, _t(args, "input"), "all_to_all_single", splits=splits)]
        if name == "alltoall_":
            return [_base(rec, rank, _listed(rec, _t(args, "input_tensors")), "all_to_all")]
        if name == "gather_":
            return [_base(rec, rank, _t(args, "input_tensors"), "gather",
                          root=_local(group, args["root_rank"]))]
        if name == "scatter_":
            return [_base(rec, rank, _listed(rec, _t(args, "output_tensors")), "scatter",
                          root=_local(group, args["root_rank"]))]
        if name in {"barrier", "monitored_barrier_"}:
            return [_base(rec, rank, {"shape": [], "dtype": "none", "device": "cpu"},
                          "barrier" if name == "barrier" else "monitored_barrier")]
        if name in {"send", "isend"}:
            key = "tensors" if "tensors" in args else "tensor"
            peer = _local(group, args["dst"])
            return [_base(rec, rank, _t(args, key), "send", peer=peer, tag=args.get("tag", 0))]
        if name in {"recv_", "recv_any_source_", "irecv"}:
            key = "tensors" if "tensors" in args else "tensor"
            peer = _local(group, args["src"]) if "src" in args else None
            return [_base(rec, rank, _t(args, key), "recv", peer=peer, tag=args.get("tag", 0))]
    except (KeyError, IndexError, TypeError) as e:
        raise UnknownOp(f"{op}: arguments not as recorded by this version ({e!r})") from None
    raise UnknownOp(f"{op} is not in the op table")


WAIT_OPS = {"_c10d_functional::wait_tensor"}
