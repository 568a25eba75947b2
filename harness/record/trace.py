"""Per-rank trace files: their format, and reading them back with every fault named.

A trace is JSON lines: ``{"header": {...}}`` first, then ``{"call": {...}}`` and
``{"wait": {...}}`` records in issue order, and ``{"end": {"calls": N}}`` when the process
exited through Python's normal shutdown. No pickle, no tensor contents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "collective-record-trace"
VERSION = 1
# The launcher sets this to "native" for the C++ kernel (harness/record/native), else "python".
HOOK_ENV = "COLLECTIVE_RECORD_HOOK"
MAX_TRACE_BYTES = 256 << 20
MAX_LINE = 1 << 20


class TraceError(Exception):
    """A trace file that cannot be read: the message names the file and the record."""


@dataclass
class RankTrace:
    """One process's calls and waits, as recorded."""

    path: Path
    rank: int
    world_size: int
    torch: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False
    truncated: str = ""  # why the last record is missing, when it is


def _short(text: str, limit: int = 60) -> str:
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.encode("unicode_escape").decode("ascii")


def _check_call(path: Path, n: int, call: Any) -> None:
    if not isinstance(call, dict):
        raise TraceError(f"{path}: record {n}: a call must be an object")
    for key, kind in (("op", str), ("seq", int), ("site", str), ("args", dict)):
        if not isinstance(call.get(key), kind):
            raise TraceError(f"{path}: record {n}: call field '{key}' is missing or not a "
                             f"{kind.__name__} (is this a collective-record trace?)")
    group = call.get("group")
    if group is not None and not (isinstance(group, list)
                                  and all(type(r) is int and r >= 0 for r in group)):
        raise TraceError(f"{path}: record {n}: 'group' must be a list of ranks")


def read_trace(path: Path) -> RankTrace:
    """Read one rank's trace; a torn last line (the process died mid-write) is kept as a
    note, anything else malformed raises :class:`TraceError`."""
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: larger than {MAX_TRACE_BYTES >> 20} MiB")
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text (byte {e.start}); not a collective-record "
                         "trace") from None
    lines = text.split("\n")
    torn = not text.endswith("\n")
    if lines and lines[-1] == "":
        lines.pop()
    trace: RankTrace | None = None
    for n, line in enumerate(lines, 1):
        last = n == len(lines)
        if len(line) > MAX_LINE:
            raise TraceError(f"{path}: record {n}: line longer than {MAX_LINE} bytes")
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            if last and torn and trace is not None:
                trace.truncated = f"record {n} cut off mid-write"
                break
            raise TraceError(f"{path}: record {n}: not JSON ({_short(str(e))}): "
                             f"{_short(line)}") from None
        if not isinstance(rec, dict) or len(rec) != 1:
            raise TraceError(f"{path}: record {n}: expected one of header/call/wait/end, got "
                             f"{_short(line)}")
        (kind, body), = rec.items()
        if trace is None:
            trace = _header(path, kind, body)
            continue
        if kind == "call":
            _check_call(path, n, body)
            trace.calls.append(body)
        elif kind == "wait":
            if not isinstance(body, dict):
                raise TraceError(f"{path}: record {n}: a wait must be an object")
            trace.waits.append(body)
        elif kind == "end":
            trace.ended = True
        else:
            raise TraceError(f"{path}: record {n}: unknown record kind '{_short(kind)}'")
    if trace is None:
        raise TraceError(f"{path}: empty: the process wrote no header (did it call any "
                         "collective?)")
    return trace


def _header(path: Path, kind: str, body: Any) -> RankTrace:
    if kind != "header" or not isinstance(body, dict) or body.get("format") != FORMAT:
        raise TraceError(f"{path}: record 1: not a {FORMAT} header (a foreign file?)")
    if body.get("version") != VERSION:
        raise TraceError(f"{path}: record 1: trace version {_short(str(body.get('version')))}"
                         f", this collective-record reads version {VERSION}")
    rank, world = body.get("rank"), body.get("world_size")
    if type(rank) is not int or type(world) is not int:
        raise TraceError(f"{path}: record 1: rank and world_size must be integers")
    return RankTrace(path, rank, world, str(body.get("torch", "?")))


def read_folder(folder: Path) -> list[RankTrace]:
    """Every rank's trace in ``folder``, ordered by rank; processes that never initialised a
    process group (the launcher) are left out."""
    traces = [read_trace(p) for p in sorted(folder.glob("trace-*.jsonl"))]
    traces = [t for t in traces if t.rank >= 0]
    seen: dict[int, Path] = {}
    for t in traces:
        if t.rank in seen:
            raise TraceError(f"{t.path}: rank {t.rank} was also recorded in {seen[t.rank]}: "
                             "one launch per recording")
        seen[t.rank] = t.path
    return sorted(traces, key=lambda t: t.rank)
