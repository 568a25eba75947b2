"""What the guard digests for each checked c10d op, and the call's spec for the checker.

For a sampled call the rank-side kernel (:mod:`harness.guard.rank`) asks :func:`plan_for` for
the digests to take before the op is issued (a reduction's inputs: the op overwrites them) and
a function that takes the ones after it completed; both run torch ops on the tensors' device and
never write to the user's tensors. Ops not listed here (the functional collectives DTensor
issues, scatter/gather, all_to_all, coalesced forms, sparse all_reduce, recv from any source)
are not checked: :data:`CHECKED` is the list the docs page repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._C import _distributed_c10d as c10d

from harness.guard import digest

# dispatcher op -> (op family the sampling counts per group, check kind)
CHECKED: dict[str, tuple[str, str]] = {
    "allreduce_": ("all_reduce", "reduce"),
    "broadcast_": ("broadcast", "broadcast"),
    "_allgather_base_": ("all_gather", "gather"),
    "allgather_": ("all_gather", "gather"),
    "_reduce_scatter_base_": ("reduce_scatter", "reduce_scatter"),
    "reduce_scatter_": ("reduce_scatter", "reduce_scatter"),
    "send": ("p2p", "p2p"),
    "recv_": ("p2p", "p2p"),
}
_REDUCE = {0: "sum", 1: "avg", 2: "product", 3: "min", 4: "max", 5: "band", 6: "bor",
           7: "bxor", 8: "premul_sum"}
Digests = list[torch.Tensor]


@dataclass
class Plan:
    """One sampled call: its spec, the digests taken before, how to take the ones after."""

    spec: dict[str, Any]
    before: Digests
    after: Callable[[], Digests]
    tensors: list[torch.Tensor] = field(default_factory=list)  # what the call moved
    inputs: list[torch.Tensor] = field(default_factory=list)  # what a case replays as input


def group_of(value: Any) -> Any:
    """The pybind ProcessGroup of a dispatcher argument (boxed as a ScriptObject)."""
    return value if isinstance(value, c10d.ProcessGroup) else c10d.ProcessGroup.unbox(value)


def reduce_name(value: Any) -> str:
    """A boxed ReduceOp's name (``sum``, ``avg``, ...)."""
    raw = getattr(value, "op", value)  # a ScriptObject's method, a pybind ReduceOp's attribute
    if isinstance(value, torch.ScriptObject):
        raw = raw()
    raw = getattr(raw, "value", raw)  # a RedOpType enum
    return _REDUCE.get(int(raw), "unknown")


def dtype_facts(dtype: torch.dtype, reduce: str | None = None) -> dict[str, Any]:
    """The dtype facts the checker's bound needs: floats' unit roundoff and smallest normal,
    integers' width; a reduction the linear check cannot follow is marked ``linear: no``."""
    key = (dtype, reduce)
    got = _FACTS.get(key)
    if got is not None:
        return dict(got)
    facts: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."),
                             "per": max(dtype.itemsize // 4, 1)}
    if dtype.is_floating_point or dtype.is_complex:
        real = torch.empty(0, dtype=dtype).real.dtype if dtype.is_complex else dtype
        info = torch.finfo(real)
        facts.update(u=info.eps / 2, tiny=info.tiny)
    elif dtype == torch.bool:
        facts["linear"] = "no"
    else:
        facts["bits"] = torch.iinfo(dtype).bits
    if reduce is not None and reduce not in ("sum", "avg", "min", "max"):
        facts["linear"] = "no"
    if dtype.is_complex and reduce in ("min", "max"):
        facts["linear"] = "no"
    _FACTS[key] = facts
    return dict(facts)


_FACTS: dict[tuple[torch.dtype, str | None], dict[str, Any]] = {}


def spec_of(name: str, group: list[int], dtype: torch.dtype, chunk: int, reduce: int = -1,
            root: int = -1, peer: int = -1, tag: int = 0) -> dict[str, Any]:
    """The spec of a sampled call the C++ kernel digested, from the facts it kept (the same
    dict :func:`plan_for` makes for the call)."""
    kind = CHECKED[name][1]
    red = _REDUCE.get(reduce, "unknown") if kind in ("reduce", "reduce_scatter") else None
    spec = {"kind": kind, "group": group} | dtype_facts(dtype, red)
    if red is not None:
        spec["reduce"] = red
    if kind == "broadcast":
        spec["root"] = root
    spec["chunk"] = chunk
    if kind == "p2p":
        spec |= {"peer": peer, "tag": tag}
    return spec


def _lin(t: torch.Tensor, chunk: int) -> torch.Tensor:
    return digest.linear(torch.view_as_real(t) if t.is_complex() else t, chunk)


def plan_for(name: str, args: tuple[Any, ...], group: list[int], chunk: int) -> Plan | None:
    """The plan of a sampled call of dispatcher op ``name`` (None: this form is not checked)."""
    w = len(group)
    base = {"kind": CHECKED[name][1], "group": group}
    if name == "allreduce_":
        tensors, reduce = args[0], reduce_name(args[2])
        if len(tensors) != 1 or args[3] is not None or not tensors[0].numel():
            return None
        t = tensors[0]
        n = digest.chunk_len(t.numel(), chunk)
        spec = base | dtype_facts(t.dtype, reduce) | {"reduce": reduce, "chunk": n}
        linear = spec.get("linear") != "no"
        before = [_lin(t, chunk)] if linear else []
        return Plan(spec, before, lambda: ([_lin(t, chunk)] if linear else [])
                    + [digest.exact(t, chunk)], [t], [t])
    if name == "broadcast_":
        tensors = args[0]
        spec = base | dtype_facts(tensors[0].dtype) | {"root": int(args[2]), "chunk": max(
            digest.chunk_len(x.numel(), chunk) for x in tensors)}
        n = spec["chunk"]
        return Plan(spec, [], lambda: [digest.exact(x, n) for x in tensors], list(tensors),
                    [tensors[0]])
    if name in ("_allgather_base_", "allgather_"):
        if name == "allgather_":
            if len(args[1]) != 1:
                return None
            out, inp = list(args[0][0]), args[1][0]
        else:
            out, inp = digest.blocks(args[0], w), args[1]
        if len(out) != w or any(o.numel() != inp.numel() for o in out):
            return None
        n = digest.chunk_len(inp.numel(), chunk)
        spec = base | dtype_facts(inp.dtype) | {"chunk": n}
        return Plan(spec, [digest.exact(inp, n)], lambda: [digest.exact(o, n) for o in out],
                    [inp, *out], [inp])
    if name in ("_reduce_scatter_base_", "reduce_scatter_"):
        if name == "reduce_scatter_":
            if len(args[0]) != 1:
                return None
            out, ins = args[0][0], list(args[1][0])
        else:
            out, ins = args[0], digest.blocks(args[1], w)
        reduce = reduce_name(args[3])
        if len(ins) != w or any(i.numel() != out.numel() for i in ins):
            return None
        n = digest.chunk_len(out.numel(), chunk)
        spec = base | dtype_facts(out.dtype, reduce) | {"reduce": reduce, "chunk": n}
        if spec.get("linear") == "no":
            return None
        return Plan(spec, [_lin(i, n) for i in ins], lambda: [_lin(out, n)], [*ins, out], ins)
    if name in ("send", "recv_"):
        tensors = args[0]
        if len(tensors) != 1 or (name == "recv_" and int(args[2]) < 0):
            return None
        t = tensors[0]
        n = digest.chunk_len(t.numel(), chunk)
        spec = base | dtype_facts(t.dtype) | {"chunk": n, "peer": int(args[2]),
                                               "tag": int(args[3])}
        if name == "send":
            return Plan(spec, [digest.exact(t, n)], lambda: [], [t], [t])
        return Plan(spec, [], lambda: [digest.exact(t, n)], [t])
    return None
