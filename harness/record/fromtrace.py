"""Case files from traces others captured: Flight Recorder dumps and execution traces.

``collective-record --from-trace PATH...`` reads, per rank, one of
- a torch Flight Recorder dump as JSON (``_dump_fr_trace_json``) or as a pickle (what
  ``TORCH_FR_DUMP_TEMP_FILE`` dumps write; ``_dump_fr_trace``): the pickle's opcodes are
  checked to build plain data only, then a restricted unpickler that refuses every global
  loads it, so a hostile pickle runs nothing (:mod:`harness.record.plaindata` reads both
  forms, bounded);
- a torch execution trace (``torch.profiler.ExecutionTraceObserver`` JSON).
The format is told by the content, never by the name. The rank a file belongs to is its
``rank`` field where it has one, else the digits that end its name (torch's own
``<prefix><rank>`` convention), below MAX_RANKS either way. Work is bounded (file size,
values, entry count, sizes, ranks, and the calls times their group sizes); every fault is
one line naming the file and the entry.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.record.cases import Recording
from harness.record.exectrace import calls_from_et
from harness.record.flightrec import calls_from_fr
from harness.record.importing import MAX_CALL_RANKS, MAX_RANKS, Imported
from harness.record.plaindata import load_document
from harness.record.trace import TraceError, short

MAX_FILES = 4096


def _kind(path: Path, doc: Any) -> str:
    if isinstance(doc, dict) and "entries" in doc and "version" in doc:
        return "fr"
    if isinstance(doc, dict) and "nodes" in doc and "schema" in doc:
        return "et"
    keys = ", ".join(sorted(map(str, doc))[:6]) if isinstance(doc, dict) else type(doc).__name__
    raise TraceError(f"{path}: neither a Flight Recorder dump (entries, version, pg_config) "
                     f"nor an execution trace (schema, nodes); it has: {short(keys, 80)}")


def file_rank(path: Path, doc: dict[str, Any]) -> int:
    """The rank a dump belongs to: its ``rank`` field, else the digits ending its name."""
    rank = doc.get("rank")
    if rank is not None:
        if type(rank) is not int or not 0 <= rank < MAX_RANKS:
            raise TraceError(f"{path}: field 'rank' is not a rank below {MAX_RANKS}: "
                             f"{short(repr(rank), 80)}")
        return rank
    m = re.search(r"(\d+)$", path.stem if path.suffix in {".json", ".pkl"} else path.name)
    if m is None:
        raise TraceError(f"{path}: cannot tell which rank wrote it (no 'rank' field and no "
                         "digits ending its name); name it <prefix><rank>, as torch's dumps do")
    if len(m.group(1)) > len(str(MAX_RANKS)) or int(m.group(1)) >= MAX_RANKS:
        raise TraceError(f"{path}: the digits ending its name, {short(m.group(1), 20)}, are "
                         f"not a rank below {MAX_RANKS}; give it a 'rank' field or rename it")
    return int(m.group(1))


def recording_from_files(paths: list[Path], skip_unknown: bool = False) -> Recording:
    """A Recording from per-rank Flight Recorder dumps or execution traces."""
    if len(paths) > MAX_FILES:
        raise TraceError(f"{len(paths)} files: at most {MAX_FILES} ranks are imported at once")
    docs: list[tuple[Path, str, int, dict[str, Any]]] = []
    seen: dict[int, Path] = {}
    for path in paths:
        doc = load_document(path)
        kind = _kind(path, doc)
        rank = file_rank(path, doc)
        if rank in seen:
            raise TraceError(f"{path}: rank {rank} was also given by {seen[rank]}")
        seen[rank] = path
        docs.append((path, kind, rank, doc))
    if len({kind for _, kind, _, _ in docs}) > 1:
        raise TraceError("mixed inputs: give Flight Recorder dumps or execution traces, not both")
    hint = max(len(docs), max(seen) + 1)
    parts: list[tuple[str, Imported]] = []
    rank_calls = 0
    for path, kind, rank, doc in docs:
        part = (calls_from_fr(path, doc, rank, hint) if kind == "fr"
                else calls_from_et(path, doc, rank, hint))
        # Writing the cases costs each call the size of its group (signatures, world checks):
        # bounded here, before that work, since groups come from the files.
        rank_calls += sum(len(c.group) or part.world_size or hint for c in part.calls)
        if rank_calls > MAX_CALL_RANKS:
            raise TraceError(f"{path}: the calls imported so far, each counted by the ranks of "
                             f"its group, exceed the {MAX_CALL_RANKS} an import handles; import "
                             "fewer files or a shorter trace")
        parts.append((kind, part))
    unknown = [u for _, p in parts for u in p.unknown]
    if unknown and not skip_unknown:
        raise TraceError(f"{unknown[0]}" + (f" (and {len(unknown) - 1} more)" if len(unknown)
                                            > 1 else "")
                         + "; rerun with --skip-unknown to write the other calls")
    return merge([p for _, p in parts], paths, unknown)


def merge(parts: list[Imported], paths: list[Path], unknown: list[str]) -> Recording:
    """One Recording from every rank's import: world size, what is missing, what it lacked."""
    ranks = sorted(p.rank for p in parts)
    declared = {p.world_size for p in parts if p.world_size}
    if len(declared) > 1:
        raise TraceError(f"the files disagree on the world size: {sorted(declared)}")
    world = declared.pop() if declared else max(ranks) + 1
    lacks: list[str] = []
    if not any(p.world_size for p in parts):
        lacks.append(f"the world size: taken as {world}, from the ranks of the files given")
    for p in parts:
        for line in p.lacks:
            if line not in lacks:
                lacks.append(line)
    if ranks[-1] >= world:
        raise TraceError(f"{paths[-1]}: rank {ranks[-1]} outside the world of {world}")
    partial = [f"ranks {sorted(set(range(world)) - set(ranks))} have no file: only the "
               "calls of the ranks given are in the cases"] if len(ranks) < world else []
    partial += [line for p in parts for line in p.partial]
    notes = [line for p in parts for line in p.not_replayed]
    names = ", ".join(p.name for p in paths[:4]) + (" ..." if len(paths) > 4 else "")
    return Recording(world_size=world, calls=[c for p in parts for c in p.calls],
                     source=f"{parts[0].kind} {names}", partial=partial, unknown=unknown,
                     lacks=lacks, notes=notes)
