"""What the recorder keeps per call, and how it becomes a trace line.

The capture runs inside every recorded collective, on the rank's critical path, so it reads
only what cannot wait: a tensor's shape (as a plain tuple), strides, contiguity, dtype, device
and layout; a group as its cached tuple of global ranks (the group may be destroyed before the
batch is written); the call site as its cached JSON text. A ReduceOp is kept as the
ScriptObject the dispatcher passed: its only accessor, ``op()``, is a TorchScript method call
(measured 7 us of the 40 us the hook added per call at world size 1), so the writer thread
reads it (:func:`resolve`). The writer then looks the call up in a cache of JSON texts: a DDP
run's thousands of identical bucket all_reduces are encoded once.

What is kept matters as much as what is computed: kept records survive Python's
young-generation collections, and survivors that hold GC-tracked objects (``torch.Size``,
code objects, tuples of them) are promoted, until the cyclic GC runs a full collection of
every object the process has (all of torch's: 0.1-0.2 s each on the development machine,
measured 45 us per recorded call amortized). So a kept call holds only strings, ints, plain
tuples of them, and objects the GC does not track (dtype, device, layout, ScriptObject):
untracked at its first collection.

The JSON written is the same as the recorder wrote when it built the dicts per call.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch._C import _distributed_c10d as c10d

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_HERE = str(Path(__file__).resolve().parent)
_DIST_DIR = os.path.join(_TORCH_DIR, "distributed")
_API_FILES = {dist.distributed_c10d.__file__, fc.__file__}
_REDUCE = {0: "sum", 1: "avg", 2: "product", 3: "min", 4: "max", 5: "band", 6: "bor",
           7: "bxor", 8: "premul_sum"}
_ENC = json.JSONEncoder(separators=(",", ":"))
_STRIDED = torch.strided

# A captured argument is (tag, payload); the tag says how the payload is written.
# Plain values are tagged by type so that True, 1 and 1.0 (equal as dict keys) never share a
# cached JSON text.
TENSOR, TENSORS, NESTED, GROUP, REDUCE, INTS, NONE, BOOL, INT, FLOAT, STR, REDUCE_OBJ = range(12)
_PLAIN = {type(None): NONE, bool: BOOL, int: INT, float: FLOAT, str: STR}
Captured = tuple[int, Any]
Capture = Callable[[Any], Captured]
# A kept call: op name, captured arguments, API function (or None), the site's JSON text,
# thread name, sequence number. Nothing the GC keeps tracking: see above.
CallTuple = tuple[str, tuple[tuple[str, Captured], ...], str | None, str, str, int]

_GROUPS: dict[str, tuple[int, ...]] = {}  # group name -> its global ranks, once per group


def tensor_meta(t: Any) -> tuple[Any, ...]:
    """A tensor's layout as plain values and the objects it already holds (nothing formatted
    here; the shape as a tuple, which the GC can stop tracking, unlike ``torch.Size``)."""
    layout = t.layout
    if layout == _STRIDED:
        return (tuple(t.shape), t.stride(), t.is_contiguous(), t.dtype, t.device, layout)
    try:  # some sparse layouts raise on is_contiguous(): never fail the user's call for it
        contiguous = t.is_contiguous()
    except RuntimeError:
        contiguous = False
    return (tuple(t.shape), None, contiguous, t.dtype, t.device, layout)


class OwnWorld(tuple):  # type: ignore[type-arg]
    """The ranks of a group made by ``new_group`` whose members are the whole world: a group
    of its own, which a backend may treat otherwise than the default group (its own
    communicator, its own sequence numbers), so the case keeps it apart. Never equal to the
    default group's ranks: the calls' JSON is cached by their captured arguments."""

    def __eq__(self, other: object) -> bool:
        return type(other) is OwnWorld and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((OwnWorld, tuple(self)))


def _group_ranks(name: str, pg: Any) -> tuple[int, ...]:
    got = _GROUPS.get(name)
    if got is None:
        got = tuple(dist.get_process_group_ranks(pg))
        if got == tuple(range(dist.get_world_size())) and name != _default_name():
            got = OwnWorld(got)
        _GROUPS[name] = got
    return got


def _default_name() -> str:
    try:
        return str(dist.distributed_c10d._get_default_group().group_name)
    except (RuntimeError, ValueError, AttributeError):  # no default group: none is it
        return ""


def capture_group(value: Any) -> Captured:
    """A ProcessGroup argument (boxed as a ScriptObject by the dispatcher) as its ranks."""
    pg = value if type(value) is c10d.ProcessGroup else c10d.ProcessGroup.unbox(value)
    return GROUP, _group_ranks(pg.group_name, pg)


def forget_groups() -> None:
    """Drop the cached ranks: after destroy_process_group torch may reuse a group's name."""
    _GROUPS.clear()


def capture_group_name(value: Any) -> Captured:
    """A functional collective's ``group_name`` argument as the group's ranks."""
    name = str(value)
    got = _GROUPS.get(name)
    if got is None:
        pg = c10d._resolve_process_group(name)  # type: ignore[arg-type]
        got = _group_ranks(name, pg)
    return GROUP, got


def capture_reduce_op(value: Any) -> Captured:
    """A c10d ReduceOp, kept as it is: :func:`resolve` reads it on the writer's thread."""
    return REDUCE_OBJ, value


def resolve(args: tuple[tuple[str, Captured], ...]) -> tuple[tuple[str, Captured], ...]:
    """The captured arguments with a kept ReduceOp read (``op()``, its only accessor)."""
    if not any(tag == REDUCE_OBJ for _, (tag, _) in args):
        return args
    return tuple((name, (REDUCE, int(payload.op())) if tag == REDUCE_OBJ else (tag, payload))
                 for name, (tag, payload) in args)


def capture_reduce_name(value: Any) -> Captured:
    """A functional collective's reduce op, given as a string."""
    return REDUCE, str(value).lower()


def capture_tensor(value: Any) -> Captured:
    """A Tensor argument."""
    return TENSOR, tensor_meta(value)


def capture_tensors(value: Any) -> Captured:
    """A Tensor[] argument."""
    return TENSORS, tuple(tensor_meta(t) for t in value)


def capture_any(value: Any) -> Captured:
    """Any other argument, told apart by its value (as the schema type does not say)."""
    if isinstance(value, torch.Tensor):
        return TENSOR, tensor_meta(value)
    if isinstance(value, (list, tuple)) and value:
        first = value[0]
        if isinstance(first, torch.Tensor):
            return TENSORS, tuple(tensor_meta(t) for t in value)
        if isinstance(first, (list, tuple)):
            return NESTED, tuple(tuple(tensor_meta(t) for t in inner) for inner in value)
    tag = _PLAIN.get(type(value))
    if tag is not None:
        return tag, value
    if isinstance(value, (bool, int, float, str)):  # a subclass: written as its base value
        base = next(t for t in (bool, int, float, str) if isinstance(value, t))
        return _PLAIN[base], base(value)
    if isinstance(value, (list, tuple)):
        return INTS, tuple(int(v) for v in value)
    return STR, f"<{type(value).__name__}>"


def capture_for(name: str, kind: str) -> Capture:
    """The capture function of one schema argument, chosen once per op."""
    if kind == "Tensor":
        return capture_tensor
    if kind == "Tensor[]":
        return capture_tensors
    if "ProcessGroup" in kind:
        return capture_group
    if "ReduceOp" in kind:
        return capture_reduce_op
    if name == "group_name":
        return capture_group_name
    if name == "reduce_op":
        return capture_reduce_name
    return capture_any


# code object -> (user code: a candidate call site, torch.distributed function name or None,
# public API file). Filled once per code object: a frame then costs a dict lookup.
_CODES: dict[CodeType, tuple[bool, str | None, bool]] = {}


def classify(code: CodeType) -> tuple[bool, str | None, bool]:
    """Whether ``code`` is the user's (a call-site candidate), the torch.distributed function it
    is (or None), and whether it is in a public API file; cached per code object."""
    name = code.co_filename
    user = not (name.startswith(_TORCH_DIR) or name.startswith(_HERE) or name.startswith("<"))
    dist_fn = code.co_name if code.co_name != "wrapper" and name.startswith(_DIST_DIR) else None
    got = (user, dist_fn, name in _API_FILES)
    _CODES[code] = got
    return got


def where() -> tuple[str, str | None]:
    """One walk of the Python stack: the user's call site (the innermost frame outside torch
    and the recorder) as its JSON text, and the torch.distributed function the user called
    (the outermost frame of the public API files, else the outermost torch.distributed frame;
    none for calls issued from C++, such as DDP's Reducer)."""
    f: Any = sys._getframe(1)  # the recorder's own frames are not user code: walked past
    site = None
    api = outer = None
    codes = _CODES
    while f is not None:
        code = f.f_code
        kind = codes.get(code) or classify(code)
        if kind[0]:
            if site is None:
                site = (code, f.f_lineno)
        elif kind[1] is not None:
            outer = kind[1]
            if kind[2]:
                api = kind[1]
        f = f.f_back
    return site_json(site), api or outer


# ---- JSON texts, cached ----

_TENSOR_DICTS: dict[tuple[Any, ...], dict[str, Any]] = {}
_STATIC: dict[tuple[Any, ...], str] = {}  # (op, args, api) -> JSON of the call, open at the end
_SITES: dict[tuple[CodeType, int] | None, str] = {}
_CACHE_MAX = 1 << 16  # distinct calls (shapes) cached; past this the caches start over


def _cached(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    if len(cache) >= _CACHE_MAX:  # a run whose shapes never repeat must not grow memory
        cache.clear()
    cache[key] = value
    return value


def _tensor_dict(meta: tuple[Any, ...]) -> dict[str, Any]:
    got = _TENSOR_DICTS.get(meta)
    if got is None:
        shape, stride, contiguous, dtype, device, layout = meta
        got = _cached(_TENSOR_DICTS, meta, {
            "shape": list(shape), "stride": None if stride is None else list(stride),
            "contiguous": bool(contiguous), "dtype": str(dtype)[6:], "device": device.type,
            "layout": str(layout)[6:]})
    return got


def _call_dict(op: str, args: tuple[tuple[str, Captured], ...], api: str | None
               ) -> dict[str, Any]:
    call: dict[str, Any] = {"op": op, "args": {}}
    out = call["args"]
    for name, (tag, payload) in args:
        if tag == GROUP:
            call["group"] = list(payload)
            if isinstance(payload, OwnWorld):
                call["own_group"] = True
        elif tag == REDUCE:
            call["reduce_op"] = (payload if isinstance(payload, str)
                                 else _REDUCE.get(payload, str(payload)))
        elif tag == TENSOR:
            out[name] = _tensor_dict(payload)
        elif tag == TENSORS:
            out[name] = [_tensor_dict(m) for m in payload]
        elif tag == NESTED:
            out[name] = [[_tensor_dict(m) for m in inner] for inner in payload]
        elif tag == INTS:
            out[name] = list(payload)
        else:
            out[name] = payload
    call["api"] = api
    return call


def site_json(site: tuple[CodeType, int] | None) -> str:
    """A call site, (code, line) or None, as its JSON text (cached)."""
    got = _SITES.get(site)
    if got is None:
        text = "?" if site is None else f"{site[0].co_filename}:{site[1]}"
        got = _cached(_SITES, site, _ENC.encode(text))
    return got


def call_json(op: str, args: tuple[tuple[str, Captured], ...], api: str | None) -> str:
    """The JSON text of a call's op, arguments, group, reduce op and API, left open at the
    end for the site, thread and sequence number (cached per distinct call)."""
    key = (op, args, api)
    got = _STATIC.get(key)
    if got is None:
        got = _cached(_STATIC, key, _ENC.encode(_call_dict(op, args, api))[:-1])
    return got


def call_line(static: str, site: str, thread: str, seq: int) -> str:
    """A call's trace line (without the newline) from its :func:`call_json` text."""
    return f'{{"call":{static},"site":{site},"thread":{_ENC.encode(thread)},"seq":{seq}}}}}'


def format_wait(seq: int | None, what: str, after: int, site: str) -> str:
    """One wait record (``site`` as :func:`where` gives it) as its trace line."""
    return (f'{{"wait":{{"call":{"null" if seq is None else seq},"what":"{what}",'
            f'"after":{after},"site":{site}}}}}')


def format_other(record: dict[str, Any]) -> str:
    """A header or end record (rare: encoded as it is)."""
    return _ENC.encode(record)
