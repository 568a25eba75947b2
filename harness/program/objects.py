"""Buffers of the object collectives: Python objects built from plain YAML data.

The object collectives (``broadcast_object_list``, ``all_gather_object``, ...) move picklable
Python objects, not tensors. A case gives them as plain data: a per-rank map
(``{0: [1, "a"], others: poison}``) whose values are taken verbatim (strings are strings, never
expressions), the keyword ``poison`` (a list of ``shape[0]`` sentinels, or one sentinel), or
the ``objects`` generator (rich per-rank objects: tuples, bytes, sets, nested dicts, a CPU
tensor, an optional large payload). Comparison is structural and type-strict (``1``,
``1.0`` and ``True`` differ; floats by bits; tensors by dtype, shape and bytes), so an object
that comes back converted or truncated shows up as wrong.
"""

from __future__ import annotations

import copy
import hashlib
import math
import struct
from collections.abc import Mapping
from typing import Any

from ..model import Fill, TensorCheck

# What an unwritten slot of an output list holds: no op ever produces it.
POISON = "<collective-harness: unwritten>"
FIRST_WRONG = 5
MAX_REPR = 80


def generated(params: Mapping[str, Any], rank: int, index: int) -> Any:
    """One rich object of the ``objects`` generator for (rank, index)."""
    import torch

    seed = int(params.get("seed", 0))
    size = int(params.get("size", 0))
    key = seed * 1000 + rank * 10 + index
    # Byte k is (key + k) % 251: a rotation of 0..250 repeated, built by slicing because a
    # per-byte generator took about a second for a 2 MiB payload (objects.yaml's large case).
    start = key % 251
    cycle = bytes(range(start, 251)) + bytes(range(start))
    payload = (cycle * (size // 251 + 1))[:size]
    return {
        "rank": rank,
        "index": index,
        "name": f"rank-{rank}/{index}",
        "ints": [rank, -rank - 1, 2**40 + key],
        "float": key + 0.5,
        "tuple": (rank, "x", None, True),
        "set": frozenset({rank, index, -1}),
        "bytes": payload,
        "nested": {"deep": [{"k": key}, [index, [rank]]]},
        "tensor": torch.arange(4, dtype=torch.int64) + key,
    }


def materialize(fill: Fill, form: str, shape: tuple[int, ...] | None, rank: int) -> Any:
    """This rank's object (``form="object"``) or list of objects (``form="objects"``)."""
    length = shape[0] if shape else 1
    if fill.kind == "list":
        return copy.deepcopy(fill.data)
    if fill.kind == "poison":
        return [POISON] * length if form == "objects" else POISON
    if fill.kind == "generator":
        name, params = fill.data
        if name != "objects":
            raise ValueError(f"object buffers take the 'objects' generator, not {name!r}")
        p = dict(params)
        if form == "objects":
            return [generated(p, rank, k) for k in range(length)]
        return generated(p, rank, 0)
    raise ValueError(f"an object buffer cannot be built from a {fill.kind!r} fill; give plain "
                     "data per rank, 'poison', or {generator: objects}")


def snapshot(obj: Any) -> Any:
    """A deep copy, for the "unchanged" check."""
    return copy.deepcopy(obj)


def _float_bits(x: float) -> bytes:
    return b"nan" if math.isnan(x) else struct.pack("<d", x)


def canonical(obj: Any) -> bytes:
    """A type-tagged byte encoding: equal iff the objects are structurally identical."""
    if obj is None or isinstance(obj, (bool, int, str, bytes)):
        return f"{type(obj).__name__}:{obj!r}".encode()
    if isinstance(obj, float):
        return b"float:" + _float_bits(obj)
    if isinstance(obj, (list, tuple)):
        return (f"{type(obj).__name__}[".encode() + b",".join(canonical(x) for x in obj)
                + b"]")
    if isinstance(obj, (set, frozenset)):
        return (f"{type(obj).__name__}{{".encode()
                + b",".join(sorted(canonical(x) for x in obj)) + b"}")
    if isinstance(obj, dict):
        items = sorted((canonical(k), canonical(v)) for k, v in obj.items())
        return b"dict{" + b",".join(k + b":" + v for k, v in items) + b"}"
    if hasattr(obj, "dtype") and hasattr(obj, "shape"):  # a tensor
        import torch

        t = obj.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return (f"tensor({t.dtype},{tuple(t.shape)},{obj.device.type}):".encode()
                + hashlib.sha256(data).digest())
    return f"{type(obj).__module__}.{type(obj).__qualname__}:{obj!r}".encode()


def digest(obj: Any) -> str:
    """A short hash of :func:`canonical` (cross-rank agreement checks)."""
    return hashlib.sha256(canonical(obj)).hexdigest()[:16]


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."


def compare(name: str, got: Any, exp: Any, how: str) -> TensorCheck:
    """Compare element by element (lists) or as a whole (one object)."""
    check = TensorCheck(tensor=name, ok=True, expectation=how, digest=digest(got))
    if isinstance(exp, list) and isinstance(got, list):
        check.total = len(exp)
        if len(got) != len(exp):
            check.ok = False
            check.wrong = len(exp)
            check.note = f"list length differs: expected {len(exp)}, got {len(got)}"
            return check
        for idx, (g, e) in enumerate(zip(got, exp, strict=True)):
            if canonical(g) != canonical(e):
                check.wrong += 1
                if len(check.first_wrong) < FIRST_WRONG:
                    check.first_wrong.append((idx, _short(e), _short(g)))
    else:
        check.total = 1
        if canonical(got) != canonical(exp):
            check.wrong = 1
            check.first_wrong.append((0, _short(exp), _short(got)))
    check.ok = check.wrong == 0
    return check
