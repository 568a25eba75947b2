"""Case files from traces others captured: Flight Recorder dumps and execution traces.

``collective-record --from-trace PATH...`` reads, per rank, one of
- a torch Flight Recorder dump as JSON (``_dump_fr_trace_json``) or as a pickle (what
  ``TORCH_FR_DUMP_TEMP_FILE`` dumps write; ``_dump_fr_trace``): the pickle is read by a
  restricted unpickler that builds only plain containers, strings and numbers and refuses
  every global, so a hostile pickle runs nothing;
- a torch execution trace (``torch.profiler.ExecutionTraceObserver`` JSON).
The format is told by the content, never by the name. The rank a file belongs to is its
``rank`` field where it has one, else the digits that end its name (torch's own
``<prefix><rank>`` convention). Work is bounded (file size, entry count, sizes); every fault
is one line naming the file and the entry.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any

from harness.record.cases import Recording
from harness.record.exectrace import calls_from_et
from harness.record.flightrec import calls_from_fr
from harness.record.importing import Imported
from harness.record.trace import TraceError

MAX_IMPORT_BYTES = 256 << 20
MAX_FILES = 4096
# what a restricted unpickle may build besides dicts, lists, tuples, strings and numbers
_SAFE_GLOBALS = {("builtins", "set"), ("builtins", "frozenset")}


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused before it is
    looked up, so ``__reduce__`` tricks (os.system, open, eval) never run."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refuses the global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses a persistent id")


def _short(text: str, limit: int = 80) -> str:
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.encode("unicode_escape").decode("ascii")


def load_document(path: Path) -> Any:
    """The file's content as plain Python data (JSON or a restricted pickle)."""
    try:
        size = path.stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise TraceError(f"{path}: {size} bytes, larger than the "
                             f"{MAX_IMPORT_BYTES >> 20} MiB an imported trace may have")
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    if raw[:1] == b"\x80":  # a pickle (protocol 2 and later)
        try:
            return _as_json(_PlainUnpickler(io.BytesIO(raw)).load(), 0)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError,
                IndexError, AttributeError, RecursionError, MemoryError,
                UnicodeDecodeError) as e:
            raise TraceError(f"{path}: not a plain-data pickle, refused without running it "
                             f"({_short(str(e) or type(e).__name__)})") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: neither JSON nor a pickle (byte {e.start} is not UTF-8)"
                         ) from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                         "a truncated dump?") from None
    except RecursionError:
        raise TraceError(f"{path}: JSON nested too deeply") from None


def _as_json(value: Any, depth: int) -> Any:
    """The unpickled data as JSON would give it (tuples and sets as lists)."""
    if depth > 64:
        raise RecursionError("nested too deeply")
    if isinstance(value, dict):
        return {k: _as_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_as_json(v, depth + 1) for v in value]
    return value


def _kind(path: Path, doc: Any) -> str:
    if isinstance(doc, dict) and "entries" in doc and "version" in doc:
        return "fr"
    if isinstance(doc, dict) and "nodes" in doc and "schema" in doc:
        return "et"
    keys = ", ".join(sorted(map(str, doc))[:6]) if isinstance(doc, dict) else type(doc).__name__
    raise TraceError(f"{path}: neither a Flight Recorder dump (entries, version, pg_config) "
                     f"nor an execution trace (schema, nodes); it has: {_short(keys)}")


def file_rank(path: Path, doc: dict[str, Any]) -> int:
    """The rank a dump belongs to: its ``rank`` field, else the digits ending its name."""
    rank = doc.get("rank")
    if rank is not None:
        if type(rank) is not int or not 0 <= rank < 1 << 20:
            raise TraceError(f"{path}: field 'rank' is not a rank: {_short(repr(rank))}")
        return rank
    m = re.search(r"(\d+)$", path.stem if path.suffix in {".json", ".pkl"} else path.name)
    if m is None:
        raise TraceError(f"{path}: cannot tell which rank wrote it (no 'rank' field and no "
                         "digits ending its name); name it <prefix><rank>, as torch's dumps do")
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
    parts = [(kind, calls_from_fr(path, doc, rank, hint) if kind == "fr"
              else calls_from_et(path, doc, rank, hint)) for path, kind, rank, doc in docs]
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
