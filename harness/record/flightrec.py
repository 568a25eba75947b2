"""torch Flight Recorder dumps -> calls in the case vocabulary.

A dump (format version 2.x, torch's ``_dump_fr_trace_json`` or the pickle a
``TORCH_FR_DUMP_TEMP_FILE`` dump writes) holds ``pg_config`` (process groups and their ranks,
empty on Gloo), and ``entries``: ``profiling_name`` (``nccl:all_reduce``, ``gloo:broadcast``,
``nccl:send 0->1``, ``nccl:recv 1<-0``, ``nccl:coalesced``), ``process_group`` (name, desc),
``input_sizes``/``output_sizes``, ``input_dtypes``, ``record_id``, sequence ids, ``state``, and
in the pickle form ``frames`` (the Python stack). It does not hold the reduce op, roots,
async_op and waits, strides, the device, or all_to_all splits: the file's header says so, and
rooted ops get every rank of the group as a ``src``/``dst`` axis rather than a guess.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.record.importing import (
    Imported,
    check_count,
    dtype,
    embedded_json,
    rank_list,
    shape,
    where,
)
from harness.record.optable import Call
from harness.record.trace import TraceError, short

KIND = "Flight Recorder dump"
GPU_BACKENDS = {"nccl", "ncclx", "rccl", "rcclx", "xccl", "hccl", "mccl"}
BACKENDS = GPU_BACKENDS | {"gloo"}
ALL_REDUCE = {"all_reduce", "allreduce", "allreduce_coalesced", "all_reduce_coalesced"}
ROOTED = {"broadcast": "broadcast", "_broadcast_oop": "broadcast", "reduce": "reduce",
          "_reduce_oop": "reduce", "gather": "gather", "scatter": "scatter"}
INTO_TENSOR = {"_allgather_base", "_all_gather_base", "all_gather_single",
               "all_gather_into_tensor_coalesced", "ALLGATHER_coalesced"}
RS_TENSOR = {"_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_tensor_coalesced",
             "REDUCE_SCATTER_coalesced"}
LACKS = [
    "the reduce op of each reduction: replayed with sum",
    "roots (broadcast/reduce/gather/scatter): every rank of the group is a src/dst axis value",
    "async_op and where each Work was waited: replayed as blocking calls",
    "strides: replayed contiguous; all_to_all splits: replayed even",
    "the device: taken from the backend (nccl and the like: cuda, gloo: cpu)",
]
REQUIRED = (("profiling_name", str), ("process_group", list), ("input_sizes", list),
            ("output_sizes", list), ("input_dtypes", list), ("record_id", int))


def _groups(path: Path, doc: dict[str, Any]) -> tuple[dict[str, tuple[int, ...]], int]:
    """Process-group name -> global ranks where the dump lists them, and the world size (0
    where the dump does not say). Each group is built once and shared by its calls."""
    cfg = doc.get("pg_config", {})
    if not isinstance(cfg, dict):
        raise TraceError(f"{path}: 'pg_config' is not an object")
    groups: dict[str, tuple[int, ...]] = {}
    world = 0
    for name, pg in cfg.items():
        at = f"{path}: pg_config[{short(repr(str(name)), 30)}]"
        if not isinstance(pg, dict):
            raise TraceError(f"{at} is not an object")
        raw = pg.get("ranks", "[]")
        ranks = rank_list(at, embedded_json(at, raw if isinstance(raw, str) else str(raw),
                                            "ranks"), "ranks")
        if ranks:
            groups[str(name)] = tuple(ranks)
            if pg.get("desc") == "default_pg":
                world = len(ranks)
    return groups, world


def _check(path: Path, n: int, e: Any) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise TraceError(f"{where(path, n)}: an entry must be an object")
    for key, kind in REQUIRED:
        if not isinstance(e.get(key), kind):
            raise TraceError(f"{where(path, n)}: field '{key}' is missing or not a "
                             f"{kind.__name__} (a Flight Recorder dump of another version?)")
    pg = e["process_group"]
    if len(pg) != 2 or not all(isinstance(x, str) for x in pg):
        raise TraceError(f"{where(path, n)}: 'process_group' is not [name, desc]")
    return e


def _site(frames: Any, fallback: str) -> tuple[str, str]:
    """(user call site, torch.distributed function) from a pickle dump's stack."""
    if not isinstance(frames, list):
        return fallback, ""
    site, api = fallback, ""
    for f in frames:
        if not isinstance(f, dict):
            continue
        name, line = str(f.get("filename", "")), f.get("line", "?")
        if name.endswith("distributed_c10d.py"):
            api = str(f.get("name", ""))
        elif ("/torch/" not in name and not name.endswith("typing_extensions.py")
              and not name.startswith("<") and site == fallback):
            site = f"{name}:{line}"
    return site, api


def _ops(path: Path, n: int, e: dict[str, Any], rank: int, group: tuple[int, ...],
         backend: str, op: str, meta: str | None) -> list[Call]:
    at = where(path, n, e["profiling_name"][:60])
    ins = [shape(at, s, "an input size") for s in e["input_sizes"]]
    outs = [shape(at, s, "an output size") for s in e["output_sizes"]]
    out_types = e.get("output_dtypes")
    types = [dtype(at, d) for d in e["input_dtypes"]] or [
        dtype(at, d) for d in (out_types if isinstance(out_types, list) else [])
        if isinstance(d, str)]
    site, api = _site(e.get("frames"), path.name)
    common = {"rank": rank, "group": group, "device": "cuda" if backend in GPU_BACKENDS
              else "cpu", "layout": "contiguous", "site": site, "api": api,
              "seq": e["record_id"]}

    def one(name: str, shp: tuple[int, ...], kind: str, **kw: Any) -> Call:
        return Call(op=name, shape=shp, dtype=kind, **common, **kw)

    if op in {"barrier", "all_reduce_barrier"}:
        return [one("barrier", (), "none")]
    if op == "scatter" and outs and types:  # a non-root rank gives no inputs
        return [one("scatter", (len(group), *outs[0]), types[0])]
    if not ins or len(types) < 1:
        raise TraceError(f"{at}: no input sizes or dtypes for a {op}")
    if len(types) < len(ins):
        types += [types[-1]] * (len(ins) - len(types))
    if op in ALL_REDUCE:
        return [one("all_reduce", s, t) for s, t in zip(ins, types, strict=False)]
    if op in ROOTED:
        name = ROOTED[op]
        return [one(name, ins[0], types[0])]
    if op == "all_gather":
        return [one("all_gather", ins[0], types[0])]
    if op in INTO_TENSOR:
        return [one("all_gather_into_tensor", s, t, form="concat")
                for s, t in zip(ins, types, strict=False)]
    if op == "reduce_scatter":
        if not outs:
            raise TraceError(f"{at}: a reduce_scatter without output sizes")
        return [one("reduce_scatter", (len(group), *outs[0]), types[0])]
    if op in RS_TENSOR:
        return [one("reduce_scatter_tensor", s, t, form="concat")
                for s, t in zip(ins, types, strict=False)]
    if op in {"all_to_all", "all_to_all_single"}:
        if len(ins) > 1:
            return [one("all_to_all", (len(ins), *ins[0]), types[0])]
        return [one("all_to_all_single", ins[0], types[0])]
    if op in {"send", "recv"}:
        sep = "->" if op == "send" else "<-"
        try:
            me, peer = (int(x) for x in (meta or "").split(sep))
        except ValueError:
            raise TraceError(f"{at}: expected '{op} A{sep}B' in the profiling name") from None
        if not (0 <= peer < len(group) and 0 <= me < len(group)):
            raise TraceError(f"{at}: peer {peer} outside its group of {len(group)}")
        return [one(op, ins[0], types[0], peer=group[peer], async_op=False)]
    raise KeyError(op)


def calls_from_fr(path: Path, doc: dict[str, Any], rank: int, world_hint: int) -> Imported:
    """One rank's Flight Recorder dump, translated; ``world_hint``: the world size to assume
    where the dump does not list the default group's ranks (Gloo's dumps)."""
    version = str(doc.get("version"))
    if not version.startswith("2."):
        raise TraceError(f"{path}: Flight Recorder format version {version[:20]!r}; this "
                         "collective-record reads the 2.x dumps of torch 2.4 and later")
    entries = check_count(path, doc["entries"], "entries")
    groups, world = _groups(path, doc)
    got = Imported(KIND, rank, world, lacks=list(LACKS))
    if not any(isinstance(e, dict) and "frames" in e for e in entries):
        got.lacks.append("call sites (the JSON form has no stacks; the pickle form has)")
    unknown_groups: dict[str, int] = {}
    coalesced = 0
    for n, raw in enumerate(entries):
        e = _check(path, n, raw)
        backend, _, name = e["profiling_name"].partition(":")
        op, _, meta = name.partition(" ")
        if backend not in BACKENDS:
            got.unknown.append(f"{where(path, n)}: backend {backend[:30]!r} of "
                               f"{e['profiling_name'][:60]!r} is not one this import reads")
            continue
        if op == "coalesced":  # the closing marker of a coalesced group: its calls came before
            coalesced += 1
            continue
        pg_name, desc = e["process_group"]
        group = groups.get(pg_name)
        if group is None and desc == "default_pg":
            group = groups.setdefault(pg_name, tuple(range(world or world_hint)))
        if group is None:
            unknown_groups[pg_name] = unknown_groups.get(pg_name, 0) + 1
            continue
        try:
            got.calls.extend(_ops(path, n, e, rank, group, backend, op, meta or None))
        except KeyError:
            got.unknown.append(f"{where(path, n)}: {e['profiling_name'][:60]!r} is not in the "
                               "op table")
    for pg, count in unknown_groups.items():
        got.not_replayed.append(f"{count} call(s) of rank {rank} on process group "
                                f"{pg[:40]!r}, whose members the dump does not list")
    if coalesced:
        got.lacks.append(f"which calls were coalesced ({coalesced} coalesced group(s) on rank "
                         f"{rank}): replayed one by one")
    first = entries[0].get("record_id") if entries else 0
    if isinstance(first, int) and first > 0:
        got.partial.append(f"rank {rank}: the Flight Recorder ring buffer had wrapped; records "
                           f"0-{first - 1} are gone (raise TORCH_FR_BUFFER_SIZE)")
    return got
