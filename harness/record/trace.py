"""Per-rank trace files: their format, and reading them back with every fault named.

A trace is JSON lines: ``{"header": {...}}`` first, then ``{"call": {...}}`` and
``{"wait": {...}}`` records in issue order, then ``{"end": {"calls": N}}`` when the process
exited through Python's normal shutdown, or ``{"stop": {"calls": N, "how": "SIGTERM"}}`` when
it was flushed on its way out by ``os._exit`` or a signal; neither after a SIGKILL or a crash
in C++, when its end is unknown. No pickle, no tensor contents.

Version 2 bounds a long run's trace while it is written (:mod:`harness.record.store`): past
its first records, a call identical to one stored is counted, not written, and those counts
live in the sidecar ``trace-<pid>.tally`` (JSON lines: a ``tally`` summary, then ``same``,
``wait``, ``drop`` and ``drop_waits`` counts), read here into :class:`Tally`. Version 1 traces
(no tally, no stop record) are read too. Both files are refused past ``MAX_TRACE_BYTES`` or a
line past ``MAX_LINE``: a defence against hostile files, which the writer stays inside by
construction.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "collective-record-trace"
VERSION = 2
READS = (1, 2)  # the trace versions this reader takes
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
    stopped: str = ""  # how it left when a stop record says so (os._exit(3), SIGTERM)
    tally: Tally | None = None  # the counts, when its tally file exists


@dataclass
class Tally:
    """A trace's counts (its ``.tally`` file): what was seen, counted and not stored."""

    seen: int  # calls the writer took, stored or not
    stored: int  # call records written
    ordered_until: int | None  # every call with a lower seq was written in order
    same: dict[int, int] = field(default_factory=dict)  # stored call's seq -> its repeats
    # (stored call's seq, "work" | "tensor", calls between the call and the wait, site, count)
    waits: list[tuple[int, str, int, str, int]] = field(default_factory=list)
    dropped: list[tuple[str, str, int]] = field(default_factory=list)  # (op, why, calls)
    waits_dropped: list[tuple[str, int]] = field(default_factory=list)  # (why, waits)


def short(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters, control characters escaped: for messages."""
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
    if call.get("own_group", False) is not True and "own_group" in call:
        raise TraceError(f"{path}: record {n}: 'own_group' is true or absent")


def tally_path(trace: Path) -> Path:
    """The tally file of a trace file (``trace-12.jsonl`` -> ``trace-12.tally``)."""
    return trace.with_suffix(".tally")


def _lines(path: Path) -> tuple[list[str], bool]:
    """A file's lines, and whether its last one is torn (no newline); within the limits."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would hang, /dev/zero never end
            raise TraceError(f"{path}: not a regular file")
        if st.st_size > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: larger than {MAX_TRACE_BYTES >> 20} MiB")
        with path.open("rb") as f:
            raw = f.read(MAX_TRACE_BYTES + 1)  # the size read, not the size stat() claims
        if len(raw) > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: larger than {MAX_TRACE_BYTES >> 20} MiB")
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
    return lines, torn


class _NotJSON(TraceError):
    """A record that does not parse (a trace's torn last line is one)."""


def _record(path: Path, n: int, line: str, kinds: str) -> tuple[str, Any]:
    """Line ``n`` of a trace or tally as (kind, body): one JSON object with one key."""
    if len(line) > MAX_LINE:
        raise TraceError(f"{path}: record {n}: line longer than {MAX_LINE} bytes")
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        raise _NotJSON(f"{path}: record {n}: not JSON ({short(str(e))}): "
                       f"{short(line)}") from None
    if not isinstance(rec, dict) or len(rec) != 1:
        raise TraceError(f"{path}: record {n}: expected one of {kinds}, got {short(line)}")
    (kind, body), = rec.items()
    return kind, body


def read_trace(path: Path) -> RankTrace:
    """Read one rank's trace and its tally, if any; a torn last line (the process died
    mid-write) is kept as a note, anything else malformed raises :class:`TraceError`."""
    lines, torn = _lines(path)
    trace: RankTrace | None = None
    for n, line in enumerate(lines, 1):
        try:
            kind, body = _record(path, n, line, "header/call/wait/end")
        except _NotJSON:
            if n == len(lines) and torn and trace is not None:
                trace.truncated = f"record {n} cut off mid-write"
                break
            raise
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
        elif kind == "stop":
            how = body.get("how") if isinstance(body, dict) else None
            trace.stopped = short(how) if isinstance(how, str) and how else "?"
        else:
            raise TraceError(f"{path}: record {n}: unknown record kind '{short(kind)}'")
    if trace is None:
        raise TraceError(f"{path}: empty: the process wrote no header (did it call any "
                         "collective?)")
    if tally_path(path).exists():
        trace.tally = read_tally(tally_path(path), {c["seq"] for c in trace.calls})
    return trace


def _check_head(path: Path, kind: str, body: Any, want: str, what: str) -> None:
    """Record 1 of a trace or tally: this format's ``want`` record, of a version read here."""
    if kind != want or not isinstance(body, dict) or body.get("format") != FORMAT:
        raise TraceError(f"{path}: record 1: not a {FORMAT} {want}"
                         " (a foreign file?)")
    if type(body.get("version")) is not int or body.get("version") not in READS:
        raise TraceError(f"{path}: record 1: {what} version {short(str(body.get('version')))}"
                         f", this collective-record reads versions "
                         f"{', '.join(map(str, READS))}")


def _header(path: Path, kind: str, body: Any) -> RankTrace:
    _check_head(path, kind, body, "header", "trace")
    rank, world = body.get("rank"), body.get("world_size")
    if type(rank) is not int or type(world) is not int:
        raise TraceError(f"{path}: record 1: rank and world_size must be integers")
    return RankTrace(path, rank, world, str(body.get("torch", "?")))


def _count(x: Any) -> bool:
    return type(x) is int and x >= 0


_TALLY_SHAPES: dict[str, tuple[type, ...]] = {
    "same": (int, int), "wait": (int, str, int, str, int), "drop": (str, str, int),
    "drop_waits": (str, int)}


def read_tally(path: Path, seqs: set[int]) -> Tally:
    """A trace's tally (``seqs``: the seqs of the calls its trace holds); a malformed line, or
    counts for a call the trace does not hold, raise :class:`TraceError`."""
    lines, torn = _lines(path)
    if torn or not lines:  # written whole and renamed into place: never torn, never empty
        raise TraceError(f"{path}: cut off or empty (a tally is written whole); not a "
                         "collective-record tally")
    tally: Tally | None = None
    for n, line in enumerate(lines, 1):
        kind, body = _record(path, n, line, "tally/same/wait/drop/drop_waits")
        if tally is None:
            tally = _tally_head(path, kind, body)
            continue
        shape = _TALLY_SHAPES.get(kind)
        if shape is None:
            raise TraceError(f"{path}: record {n}: unknown record kind '{short(kind)}'")
        if not (isinstance(body, list) and len(body) == len(shape)
                and all(_count(v) if t is int else type(v) is t
                        for v, t in zip(body, shape, strict=True))):
            raise TraceError(f"{path}: record {n}: '{kind}' must be a list of "
                             f"{', '.join(t.__name__ for t in shape)} (counts not negative): "
                             f"{short(line)}")
        if kind in ("same", "wait") and body[0] not in seqs:
            raise TraceError(f"{path}: record {n}: counts for call seq {body[0]}, which its "
                             "trace does not hold")
        if kind == "same":
            tally.same[body[0]] = body[1]
        elif kind == "wait":
            tally.waits.append((body[0], body[1], body[2], body[3], body[4]))
        elif kind == "drop":
            tally.dropped.append((body[0], body[1], body[2]))
        else:
            tally.waits_dropped.append((body[0], body[1]))
    assert tally is not None
    return tally


def _tally_head(path: Path, kind: str, body: Any) -> Tally:
    _check_head(path, kind, body, "tally", "tally")
    seen, stored, until = body.get("seen", -1), body.get("stored", -1), body.get("ordered_until")
    if not (_count(seen) and _count(stored) and (until is None or _count(until))):
        raise TraceError(f"{path}: record 1: seen and stored must be counts, ordered_until a "
                         "count or null")
    return Tally(int(seen), int(stored), until)


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
