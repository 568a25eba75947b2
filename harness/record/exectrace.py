"""torch execution traces (``ExecutionTraceObserver`` JSON) -> calls in the case vocabulary.

An execution trace lists every op the process ran as a node: ``name`` (``c10d::allreduce_``,
``c10d::_allgather_base_``, ``_c10d_functional::all_reduce``), ``inputs`` (``values``,
``shapes``, ``types`` such as ``Tensor(float)`` or ``GenericList[Tensor(float)]``,
``strides``), ``ctrl_deps`` (the parent node) and ``attrs`` (``op_schema``: the argument
names). Each ``c10d::``/``_c10d_functional::`` node is rebuilt into the recorder's own call
record and translated by :mod:`harness.record.optable`, so both paths share one op table;
nodes under another collective node (the backend's ``gloo:all_reduce`` child) are not
counted twice. The trace writes process groups and reduce ops as ``<Object>``: it has no
group of a call, no reduce op, no wait of a c10d Work and no call site, and the file's
header says so. A ``## process_group:init ##`` node lists the groups that existed when the
trace started.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.record.importing import (
    MAX_RANKS,
    Imported,
    check_count,
    dtype,
    embedded_json,
    shape,
    where,
)
from harness.record.optable import WAIT_OPS, UnknownOp, translate
from harness.record.trace import TraceError, short

KIND = "execution trace"
PREFIXES = ("c10d::", "_c10d_functional::")
SKIP = {"c10d::check_for_nan", *WAIT_OPS}
_TENSOR = re.compile(r"Tensor\((.+)\)$")
_LIST = re.compile(r"GenericList\[Tensor\((.+)\)\]$")
LACKS = [
    "the process group of each call (written as <Object>): replayed on the whole world",
    "the reduce op of each reduction (written as <Object>): replayed with sum",
    "where each c10d Work was waited, and call sites",
]


def _arg_names(at: str, schema: str) -> list[str]:
    """Argument names of an op schema string ``ns::op(Type name=default, ...) -> ...``."""
    m = re.match(r"[\w:.]+\((.*)\)\s*->", schema)
    if m is None:
        raise TraceError(f"{at}: op_schema {schema[:60]!r} is not an op schema")
    names = []
    for part in m.group(1).split(","):
        words = part.split("=", 1)[0].split()
        if len(words) >= 2:
            names.append(words[-1])
        elif words and words[0] != "*":
            raise TraceError(f"{at}: op_schema argument {part.strip()[:40]!r} has no name")
    return names


def _tensor(at: str, kind: str, value: Any, shp: Any, stride: Any) -> dict[str, Any]:
    s = shape(at, shp, "a tensor shape")
    contiguous = True
    if isinstance(stride, list) and len(stride) == len(s):
        expect, acc = [], 1
        for d in reversed(s):
            expect.append(acc)
            acc *= max(d, 1)
        contiguous = [st for st, d in zip(stride, s, strict=True) if d > 1] == [
            e for e, d in zip(reversed(expect), s, strict=True) if d > 1]
    device = value[5] if isinstance(value, list) and len(value) > 5 else "cpu"
    device = str(device).split(":")[0]
    return {"shape": list(s), "dtype": dtype(at, kind), "contiguous": contiguous,
            "device": device if device in {"cpu", "cuda"} else "cpu"}


def _args(at: str, node: dict[str, Any]) -> dict[str, Any]:
    attrs = node.get("attrs", [])
    schema = next((a.get("value") for a in attrs if isinstance(a, dict)
                   and a.get("name") == "op_schema"), None) if isinstance(attrs, list) else None
    if not isinstance(schema, str) or not schema:
        raise TraceError(f"{at}: no op_schema attribute (an execution trace of another "
                         "version?)")
    names = _arg_names(at, schema)
    inputs = node.get("inputs")
    if not isinstance(inputs, dict):
        raise TraceError(f"{at}: 'inputs' is not an object")
    values, shapes, types, strides = (inputs.get(k) for k in ("values", "shapes", "types",
                                                              "strides"))
    if not (isinstance(values, list) and isinstance(shapes, list) and isinstance(types, list)):
        raise TraceError(f"{at}: inputs lack values, shapes or types")
    if not isinstance(strides, list):
        strides = [None] * len(values)
    out: dict[str, Any] = {}
    for i, name in enumerate(names[:len(values)]):
        kind = types[i] if i < len(types) and isinstance(types[i], str) else ""
        v, sh = values[i], shapes[i] if i < len(shapes) else []
        st = strides[i] if i < len(strides) else None
        if (m := _TENSOR.match(kind)):
            out[name] = _tensor(at, m.group(1), v, sh, st)
        elif (m := _LIST.match(kind)):
            if not isinstance(v, list) or not isinstance(sh, list):
                raise TraceError(f"{at}: argument '{name}' is not a tensor list")
            sts = st if isinstance(st, list) else [None] * len(sh)
            out[name] = [_tensor(at, m.group(1), a, b, c)
                         for a, b, c in zip(v, sh, sts, strict=False)]
        elif kind in {"Int", "Bool", "String", "Double"} or kind.startswith("GenericList"):
            out[name] = v
        elif kind == "None":
            out[name] = None
    return out


def _world(path: Path, nodes: list[Any]) -> tuple[int, list[str]]:
    """The default group's size and the sizes of the other groups listed at init."""
    for k, node in enumerate(nodes):
        if isinstance(node, dict) and node.get("name") == "## process_group:init ##":
            at = where(path, k, "process_group:init")
            inputs = node.get("inputs")
            values = inputs.get("values") if isinstance(inputs, dict) else None
            if not isinstance(values, list) or not values:
                raise TraceError(f"{at}: no values listing the groups")
            groups = embedded_json(at, values[0], "the list of groups")
            sizes = [_group(at, g) for g in (groups if isinstance(groups, list) else [None])]
            world = next((n for d, n in sizes if d == "default_pg"), 0)
            return world, [d for d, n in sizes if world and n != world]
    return 0, []


def _group(at: str, g: Any) -> tuple[str, int]:
    """(pg_desc, group_size) of one group listed at init, the size within 1..MAX_RANKS."""
    desc, size = (g.get("pg_desc"), g.get("group_size")) if isinstance(g, dict) else (None, None)
    if not isinstance(desc, str) or type(size) is not int or not 0 < size <= MAX_RANKS:
        raise TraceError(f"{at}: a group is not {{pg_desc: name, group_size: 1..{MAX_RANKS}}}: "
                         + (f"pg_desc {short(repr(desc), 30)}, group_size "
                            f"{short(repr(size), 30)}" if isinstance(g, dict)
                            else short(repr(g), 40)))
    return desc, size


def _ids(path: Path, nodes: list[Any]) -> dict[int, dict[str, Any]]:
    """Node id -> node; an id or parent id that is not an integer is refused with its node."""
    by_id: dict[int, dict[str, Any]] = {}
    for k, node in enumerate(nodes):
        if not isinstance(node, dict):
            continue
        for key in ("id", "ctrl_deps"):
            if node.get(key) is not None and type(node.get(key)) is not int:
                raise TraceError(f"{where(path, k)}: '{key}' is not a node id (an integer): "
                                 f"{short(repr(node.get(key)), 40)}")
        if node.get("id") is not None:
            by_id[node["id"]] = node
    return by_id


def calls_from_et(path: Path, doc: dict[str, Any], rank: int, world_hint: int) -> Imported:
    """One rank's execution trace, translated."""
    schema = str(doc.get("schema", ""))
    if not re.match(r"1\.\d+\.\d+", schema):
        raise TraceError(f"{path}: execution trace schema {schema[:30]!r}; this "
                         "collective-record reads the 1.x schemas of torch 2.x")
    nodes = check_count(path, doc["nodes"], "nodes")
    world, smaller = _world(path, nodes)
    got = Imported(KIND, rank, world, lacks=list(LACKS))
    group = tuple(range(world or world_hint))  # shared by every call (their sole group)
    by_id = _ids(path, nodes)
    skipped = 0
    for k, node in enumerate(nodes):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise TraceError(f"{where(path, k)}: a node must be an object with a name")
        name = node["name"]
        if not name.startswith(PREFIXES) or name in SKIP or name.startswith(
                "_c10d_functional::_"):
            continue
        if _under_collective(node, by_id):
            continue
        at = where(path, k, f"node {node.get('id')}: {name[:50]}")
        if smaller:
            skipped += 1
            continue
        rec = {"op": name, "args": _args(at, node), "group": group,
               "seq": node.get("id") if type(node.get("id")) is int else k,
               "site": path.name, "api": ""}
        try:
            got.calls.extend(translate(rec, rank))
        except UnknownOp as e:
            got.unknown.append(f"{at}: {e}")
    if skipped:
        got.not_replayed.append(
            f"{skipped} call(s) of rank {rank}: the trace lists groups smaller than the world "
            f"({', '.join(smaller)[:80]}) and does not say which group a call used")
    return got


def _under_collective(node: dict[str, Any], by_id: dict[int, dict[str, Any]]) -> bool:
    """Whether a parent (ctrl_deps chain, bounded) is itself a collective node."""
    seen = 0
    parent = by_id.get(node["ctrl_deps"]) if type(node.get("ctrl_deps")) is int else None
    while parent is not None and seen < 64:
        name = parent.get("name")
        if isinstance(name, str) and name.startswith(PREFIXES):
            return True
        up = parent.get("ctrl_deps")
        parent = by_id.get(up) if type(up) is int else None
        seen += 1
    return False
