"""What external-ranks mode keeps on disk so that a relaunch resumes instead of starting over.

A hang or a crash in external mode ends the processes: there is no pool around them to kill
and restart. The launcher restarts them instead (torchrun's ``--max-restarts``; or the person
runs the same command again with ``--resume``), and the run goes on after the round that
failed. Two kinds of files make that possible, all under the state directory:

- rank 0's *progress*: a header naming the run (a fingerprint of the instances, the world size
  and the schedule), one JSON line per finished round with its records, and the round in
  flight. Rank 0 may be on another node after a restart, so for multi-node resumes the state
  directory must be on a filesystem every node sees (the usual home or scratch directory).
- each rank's *own* files for the round in flight, named by its global rank and the launch
  attempt: its result once it has one (``pending``), the step it is in (``trace``), its Python
  stack when its deadline passed (``hang``), the fatal-error dump of a crash (``crash``, from
  faulthandler), and its stack when the launcher stopped it (``killed``, faulthandler on
  SIGTERM). After a restart the first rank of each node reads every file of the previous
  attempt it can see and rank 0 merges them, so node-local state directories work too (as
  long as the nodes are the same).

Nothing here judges: :func:`recovered_run` turns the files into the raw run of a failed
instance, and :mod:`harness.external` has it judged like any other.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from ..model import GROUP_PHASE, Instance, PoolRun, RankResult, RankState, phase
from ..report.records import report_schema
from .resultfile import Pending, ResultFileError, dump_result, load_result

PROGRESS = "progress.jsonl"
INFLIGHT = "inflight.json"
KINDS = ("pending", "trace", "hang", "crash", "killed")
# Every name this module writes; a reset removes these and nothing else, so a --state-dir
# given by mistake (the project, a home directory) is refused, never emptied.
OURS = re.compile(r"(progress\.jsonl|inflight\.json"
                  r"|rank\d+\.a\d+\.(pending|trace|hang|crash|killed))(\.tmp)?")


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class StateError(Exception):
    """The state directory holds a file that is not what this harness wrote there; the message
    names the file (and line) and what to do."""


@functools.cache
def _record_validator() -> Any:
    schema = report_schema()
    return jsonschema.Draft202012Validator(
        {**schema["properties"]["records"]["items"], "$defs": schema.get("$defs", {})})


def _check_records(where: str, records: list[Any]) -> None:
    """A round's records go into the report as they are: each must be a report record (a
    field of the wrong type would otherwise stop the run at its last write)."""
    validator = _record_validator()
    for n, rec in enumerate(records):
        err = jsonschema.exceptions.best_match(validator.iter_errors(rec))
        if err is not None:
            field_path = "/".join(map(str, err.absolute_path)) or "(the record)"
            raise StateError(f"{where}: record {n}: {field_path}: {err.message[:200]!s}; "
                             "not a record this harness wrote (remove the state directory "
                             "to start over)")


def _entry(path: Path, lineno: int, line: str) -> dict[str, Any]:
    """One line of the progress file, checked: an object with the fields of its kind."""
    where = f"{path}:{lineno}"
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"{where}: not a JSON line ({type(exc).__name__})") from None
    if not isinstance(entry, dict):
        raise StateError(f"{where}: expected an object")
    if "attempt" in entry:
        if isinstance(entry["attempt"], bool) or not isinstance(entry["attempt"], int):
            raise StateError(f"{where}: 'attempt' must be a whole number")
    elif "complete" not in entry and not (
            isinstance(entry.get("round"), int) and not isinstance(entry["round"], bool)
            and isinstance(entry.get("records"), list)):
        raise StateError(f"{where}: not an entry of a progress file (attempt, complete, or a "
                         "round with its records)")
    if "records" in entry:  # each one a report record, by the report's own schema
        _check_records(where, entry["records"])
    return entry


@dataclass
class Resume:
    """What rank 0 found of an earlier attempt of the same run."""

    records: list[dict[str, Any]] = field(default_factory=list)
    next_round: int = 0
    inflight: dict[str, Any] | None = None  # the round that did not finish
    last_attempt: int = 0  # the launch that wrote the newest files
    launches: int = 0  # how many launches of this run started
    complete: bool = False  # the run reached its end (a new launch starts over)


def _inflight_ok(doc: Any) -> bool:
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return (isinstance(doc, dict) and whole(doc.get("round")) and whole(doc.get("attempt"))
            and isinstance(doc.get("retry"), bool) and isinstance(doc.get("slots"), list)
            and all(isinstance(s, list) and len(s) == 2 and whole(s[0])
                    and isinstance(s[1], list) and all(whole(g) for g in s[1])
                    for s in doc["slots"]))


class State:
    """The state directory of one run, seen from one rank."""

    def __init__(self, root: str, fingerprint: str, run_id: str, rank: int, local_rank: int,
                 attempt: int) -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.run_id = run_id
        self.rank = rank
        self.local_rank = local_rank
        self.attempt = attempt

    # -- rank 0: the run's progress ----------------------------------------------------------

    def reset(self) -> None:
        """Start a new run: forget every file of an earlier one (rank 0, before anything).
        Only files this module names are removed; a folder holding anything else is not a
        state directory (a :class:`StateError`, nothing removed)."""
        try:
            if self.root.exists() and not self.root.is_dir():
                raise StateError(f"--state-dir {self.root}: it is a file, not a folder; give "
                                 "a folder (it is created if missing)")
            found = sorted(self.root.iterdir()) if self.root.exists() else []
            other = [f.name for f in found if not (f.is_file() and OURS.fullmatch(f.name))]
            if other:
                shown = ", ".join(ascii(n) for n in other[:3])
                raise StateError(f"--state-dir {self.root}: holds files this harness did not "
                                 f"write ({shown}{', ...' if len(other) > 3 else ''}); give "
                                 "a new or empty folder")
            for f in found:
                f.unlink()
            self.root.mkdir(parents=True, exist_ok=True)
            header = {"fingerprint": self.fingerprint, "run_id": self.run_id}
            _write(self.root / PROGRESS, (json.dumps(header) + "\n").encode())
        except OSError as exc:
            raise StateError(f"--state-dir {self.root}: cannot use it: "
                             f"{exc.strerror or exc}; give a folder this run can write") from None

    def load(self, any_run: bool = False) -> Resume | None:
        """The progress of an earlier launch of this run, or None (none, another run, or a
        run that completed). ``any_run``: the launcher's run id need not match (a resume by
        hand: srun knows nothing of the earlier job)."""
        path = self.root / PROGRESS
        if not path.exists():
            return None
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            header = json.loads(lines[0])
        except (OSError, ValueError, IndexError, RecursionError) as exc:
            raise StateError(f"{path}: not a progress file this harness wrote "
                             f"({type(exc).__name__}); remove the state directory to start "
                             "over") from None
        if not isinstance(header, dict):
            raise StateError(f"{path}:1: not a progress file header")
        if header.get("fingerprint") != self.fingerprint or not (
                any_run or (self.run_id and header.get("run_id") == self.run_id)):
            return None
        out = Resume()
        for lineno, line in enumerate(lines[1:], start=2):
            entry = _entry(path, lineno, line)
            if "attempt" in entry:
                out.last_attempt = max(out.last_attempt, entry["attempt"])
                out.launches += 1
                continue
            if entry.get("complete"):
                out.complete = True
                continue
            out.records += entry["records"]
            out.next_round = entry["round"] + 1
        try:
            inflight = json.loads((self.root / INFLIGHT).read_text(encoding="utf-8"))
        except FileNotFoundError:
            inflight = None
        except (OSError, ValueError, RecursionError) as exc:
            raise StateError(f"{self.root / INFLIGHT}: not the round in flight this harness "
                             f"wrote ({type(exc).__name__}); remove the state directory to "
                             "start over") from None
        if inflight is not None and not _inflight_ok(inflight):
            raise StateError(f"{self.root / INFLIGHT}: not the round in flight this harness "
                             "wrote; remove the state directory to start over")
        if inflight and inflight.get("round") == out.next_round:
            out.inflight = inflight
        return None if out.complete else out

    def finished(self) -> None:
        """The run reached its end: a later launch of it starts over."""
        self._append({"complete": True})

    def started(self) -> None:
        """Note that launch ``attempt`` started (a resume by hand counts on from it)."""
        try:
            self._append({"attempt": self.attempt})
        except OSError as exc:
            raise StateError(f"{self.root / PROGRESS}: cannot write it: "
                             f"{exc.strerror or exc}; give a --state-dir this run can write"
                             ) from None

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self.root / PROGRESS, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def begin(self, round_index: int, slots: list[tuple[int, tuple[int, ...]]],
              retry: bool = False) -> None:
        """Record the round about to run (which instance on which global ranks)."""
        data = {"round": round_index, "attempt": self.attempt, "retry": retry,
                "slots": [[i, list(m)] for i, m in slots]}
        _write(self.root / INFLIGHT, json.dumps(data).encode())

    def commit(self, round_index: int, records: list[dict[str, Any]]) -> None:
        """The round finished (or was recovered): its records, durably."""
        self._append({"round": round_index, "records": records})
        (self.root / INFLIGHT).unlink(missing_ok=True)

    # -- every rank: its own files ----------------------------------------------------------

    def path(self, kind: str, attempt: int | None = None) -> Path:
        """This rank's file of ``kind`` for ``attempt`` (default: the current one)."""
        a = self.attempt if attempt is None else attempt
        return self.root / f"rank{self.rank}.a{a}.{kind}"

    def open_for_faulthandler(self, kind: str) -> Any:
        """An open file faulthandler writes into (kept open for the process's life)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return open(self.path(kind), "w")

    def save_pending(self, round_index: int, index: int, result: RankResult,
                     elapsed: float) -> None:
        """This rank's result of the round in flight (JSON: see :mod:`.resultfile`)."""
        _write(self.path("pending"), dump_result(Pending(self.rank, round_index, index,
                                                         elapsed, result)))

    def trace(self, round_index: int, step: int) -> None:
        _write(self.path("trace"), f"{self.rank} {round_index} {step}\n".encode())

    def write_text(self, kind: str, text: str) -> None:
        _write(self.path(kind), text.encode("utf-8", "replace"))

    def previous(self, round_index: int) -> list[dict[str, Any]]:
        """What the previous attempt's rank files visible here say about ``round_index``.

        One entry per rank that got as far as that round: ``rank`` (its global rank then),
        ``step``, and ``pending``/``hang``/``crash``/``killed`` where it left them. Only the
        first rank of a node reads (the others return nothing): rank 0 merges by ``rank``.
        """
        prev = self.attempt - 1
        if prev < 0 or self.local_rank != 0:
            return []
        out: list[dict[str, Any]] = []
        for trace in sorted(self.root.glob(f"rank*.a{prev}.trace")):
            try:
                rank, rnd, step = (int(x) for x in trace.read_text().split())
            except (OSError, ValueError):
                continue
            if rnd != round_index:
                continue
            info: dict[str, Any] = {"rank": rank, "step": step, "host": socket.gethostname()}
            base = str(trace)[: -len(".trace")]
            pending = Path(base + ".pending")
            if pending.exists():
                try:
                    got = load_result(pending)
                    if got.round == round_index:
                        info["pending"] = (got.index, got.result, got.elapsed)
                except ResultFileError as exc:
                    # A file that is not a result is never taken for one: the rank's instance
                    # is judged without it (it cannot pass).
                    info["unreadable"] = str(exc)
            for kind in ("hang", "crash", "killed"):
                try:
                    text = Path(f"{base}.{kind}").read_text(encoding="utf-8",
                                                            errors="replace")
                except OSError:
                    continue
                if text.strip():
                    info[kind] = text
            out.append(info)
        return out


def recovered_run(inst: Instance, members: tuple[int, ...], seen: dict[int, dict[str, Any]]
                  ) -> PoolRun | None:
    """A failed slot's run from the files its ranks left, or None if it was only collateral
    (every member finished, or was stopped by the launcher without a failure of its own)."""
    results: dict[int, RankResult] = {}
    states: list[RankState] = []
    failed = False
    for i, g in enumerate(members):
        info = seen.get(g, {})
        step = info.get("step", -1)
        # A rank that left no trace has -1 too: only a group's phase is said for it.
        desc = phase(inst.steps, step) if step >= 0 or step <= GROUP_PHASE else ""
        pending = info.get("pending")
        if pending is not None:
            results[i] = pending[1]
            states.append(RankState(i, "finished"))
        elif "hang" in info:
            failed = True
            states.append(RankState(i, "blocked", step=step, step_desc=desc,
                                    stack=info["hang"].strip()))
        elif "unreadable" in info:
            failed = True
            states.append(RankState(i, "died", step=step, step_desc=desc,
                                    stderr_tail="its result file in the state directory could "
                                    f"not be used: {info['unreadable']}"))
        elif "crash" in info:
            failed = True
            states.append(RankState(i, "died", step=step, step_desc=desc,
                                    signal="a fatal signal (faulthandler)",
                                    stderr_tail=info["crash"].strip()[-4000:]))
        elif "killed" in info:
            states.append(RankState(i, "killed", step=step, step_desc=desc,
                                    stack=info["killed"].strip()))
        elif info.get("rank") is not None:
            # In the round, no result, no dump of any kind: it ended by itself (os._exit).
            failed = True
            states.append(RankState(i, "died", step=step, step_desc=desc,
                                    stderr_tail="the process ended without a result or a "
                                    "fatal-error dump (it exited)"))
        else:
            states.append(RankState(i, "killed", stderr_tail="no file of this rank was found "
                                    "after the restart (another node's disk?)"))
    if not failed:
        return None
    kind = "crash" if any(s.state == "died" for s in states) else "hang"
    return PoolRun(kind=kind, results=results, states=states)  # type: ignore[arg-type]
