"""``collective-record``: run a launch command with the recorder, write the case file.

Exit status: 0 the case file is written from a complete run; 1 it is written but partial
(the command failed, a rank stopped early, or a trace's cap left calls out: the file says
what is missing); 2 bad input (an unreadable trace, an op the op table lacks, a bad option),
one line on stderr, no file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

from harness.record.cases import Recording, build, render
from harness.record.fromtrace import recording_from_files
from harness.record.optable import WAIT_OPS, Call, UnknownOp, translate
from harness.record.programs import build_programs
from harness.record.trace import HOOK_ENV, RankTrace, TraceError, read_folder

SITE = Path(__file__).resolve().parent / "site"
ROOT = Path(__file__).resolve().parents[2]
ENV = "COLLECTIVE_RECORD_DIR"


class RecordError(Exception):
    """Bad input: reported as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collective-record",
        description="Record the collectives a run issues and write them as a case file.",
        epilog="example: collective-record -o cases/recorded/train.yaml -- torchrun "
               "--nproc-per-node 2 train.py")
    p.add_argument("-o", "--output", required=True, type=Path, help="case file to write")
    p.add_argument("--granularity", choices=["call", "program"], default="call",
                   help="call: one instance per distinct call (the dtype x shape matrix); "
                        "program: one program per recorded step, call order and waits kept "
                        "(the async contract)")
    p.add_argument("--skip-unknown", action="store_true",
                   help="write the other calls when some op is not in the op table (they are "
                        "listed in the file's header)")
    p.add_argument("--trace-dir", type=Path,
                   help="keep the per-rank traces (and the counts of long runs, .tally) here "
                        "(default: a temporary folder)")
    p.add_argument("--from-trace", nargs="+", type=Path, metavar="PATH",
                   help="write the case file from traces others captured, one file per rank "
                        "(no launch command): torch Flight Recorder dumps (JSON, or the "
                        "pickle, read without running anything) or execution traces "
                        "(ExecutionTraceObserver JSON); the rank is the file's 'rank' field "
                        "or the digits ending its name")
    p.add_argument("--world-size", type=_sizes, default=[], metavar="N,N,...",
                   help="also replay at these world sizes where the pattern generalizes (every "
                        "group the world, shapes fixed or scaling with it); the other cases "
                        "say why they stay at the recorded size")
    p.add_argument("--hook", choices=["auto", "native", "python"], default="auto",
                   help="how the ranks record c10d calls: native = a C++ kernel, built once "
                        "(needs a C++ compiler; much cheaper per call), python = the Python "
                        "kernel; auto = native where it builds (default)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch command")
    return p


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of world sizes, "
                                         "e.g. 2,4,8") from None
    if not sizes or any(not 1 <= s <= 4096 for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: world sizes are 1 to 4096")
    return sizes


def _hook(choice: str) -> str:
    """The kernel the ranks use: the C++ one is built here first, so that the ranks only load
    it (a build takes about 30 s once, then it is cached)."""
    if choice == "python":
        return "python"
    from harness.record import native  # imports torch: only for a launch
    try:
        native.load_announced("collective-record")
    except native.NativeUnavailable as exc:
        if choice == "native":
            raise RecordError(f"--hook native: the C++ kernel cannot be built: {exc}") from None
        print(f"collective-record: recording with the Python kernel (the C++ one cannot be "
              f"built here: {exc}); it costs the ranks more per call (docs/howto/record.md)",
              file=sys.stderr)
        return "python"
    return "native"


def _launch(command: list[str], folder: Path, hook: str = "python") -> int:
    env = dict(os.environ)
    env[HOOK_ENV] = hook
    path = [str(SITE), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[ENV] = str(folder)
    try:
        return subprocess.run(command, env=env, check=False).returncode
    except OSError as e:
        raise RecordError(f"cannot run {command[0]!r}: {e.strerror or e}") from None


def _where(call: dict[str, object]) -> str:
    return f"{call.get('op')} at {call.get('site')}"


def _waited_text(site: object, between: int) -> str:
    return f"at {Path(str(site)).name} after {between} later call(s)"


def translate_traces(traces: list[RankTrace], skip_unknown: bool
                     ) -> tuple[list[Call], list[str]]:
    """Every rank's calls in the case vocabulary, each with the repeats its trace counted and
    its waits attached; unknown ops raise RecordError (or are returned as lines with
    ``skip_unknown``)."""
    calls: list[Call] = []
    unknown: list[str] = []
    for t in traces:
        waited: dict[int, Counter[str]] = defaultdict(Counter)
        for w in t.waits:
            if type(w.get("call")) is int:
                waited[w["call"]][_waited_text(w.get("site", "?"), max(
                    0, int(w.get("after", 0)) - int(w["call"]) - 1))] += 1
        same: dict[int, int] = {}
        until = None
        if t.tally is not None:
            same, until = t.tally.same, t.tally.ordered_until
            for seq, _, between, site, n in t.tally.waits:
                waited[seq][_waited_text(site, between)] += n
        for n, rec in enumerate(t.calls):
            if rec["op"] in WAIT_OPS:
                continue
            try:
                out = translate(rec, t.rank)
            except UnknownOp as e:
                line = f"{t.path}: call record {n + 1} (seq {rec['seq']}): {e}"
                if not skip_unknown:
                    raise RecordError(line + "; rerun with --skip-unknown to write the other "
                                      "calls") from None
                unknown.append(line)
                continue
            seq = rec["seq"]
            seen_waits = waited.get(seq)
            waits = tuple(sorted(seen_waits.items())) if seen_waits else ()
            count, ordered = 1 + same.get(seq, 0), until is None or seq < until
            calls += [replace(c, waits=waits, count=count, ordered=ordered) for c in out]
    return calls, unknown


def _count(trace: RankTrace) -> tuple[int, int]:
    """(calls the trace accounts for, of them not stored), in records."""
    lost = sum(n for _, _, n in trace.tally.dropped) if trace.tally else 0
    repeats = sum(trace.tally.same.values()) if trace.tally else 0
    return len(trace.calls) + repeats + lost, lost


def _latest(trace: RankTrace) -> str:
    if not trace.calls:
        return "no call"
    if trace.tally is not None and trace.tally.ordered_until is not None:
        # past the in-order part only new distinct calls are written: the last record is
        # not the last call
        return f"latest distinct call stored: {_where(trace.calls[-1])}"
    return f"last: {_where(trace.calls[-1])}"


def partial_notes(traces: list[RankTrace], rc: int | None, order: bool = False) -> list[str]:
    """One line per way the recording is incomplete (empty: complete); ``order``: the case
    file needs every call in issue order (``--granularity program``)."""
    notes = []
    if rc:
        notes.append(f"the launch command exited with status {rc}")
    world = max((t.world_size for t in traces), default=0)
    missing = sorted(set(range(world)) - {t.rank for t in traces})
    if missing:
        notes.append(f"ranks {missing} wrote no trace")
    for t in traces:
        known, lost = _count(t)
        torn = f" ({t.truncated})" if t.truncated else ""
        if t.stopped:
            notes.append(f"rank {t.rank} stopped by {t.stopped} after {known} call(s); "
                         f"{_latest(t)}{torn}")
        elif not t.ended:
            notes.append(f"rank {t.rank}: the end of its run is unknown (no end record: "
                         f"killed by SIGKILL or a crash); its trace accounts for {known} "
                         f"call(s), {len(t.calls)} of them stored, and any it made after its "
                         f"last flush are lost; {_latest(t)}{torn}")
        elif rc and t.calls:
            notes.append(f"rank {t.rank} made {known} call(s) before the run failed; "
                         f"{_latest(t)}")
        if lost and t.tally is not None:
            what = "; ".join(f"{n} {op} ({why})" for op, why, n in t.tally.dropped)
            notes.append(f"rank {t.rank}: {lost} of its {known} call(s) were counted but not "
                         f"stored: {what}")
        for why, n in t.tally.waits_dropped if t.tally else []:
            notes.append(f"rank {t.rank}: {n} wait(s) were counted but not stored ({why})")
        until = t.tally.ordered_until if t.tally else None
        if order and until is not None:
            notes.append(f"rank {t.rank}: its first {until} call(s) were stored in issue order "
                         f"and the programs cover them; its {known - until} later call(s) "
                         "were counted per distinct call, their order not kept")
    return notes


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring for the exit status."""
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if args.from_trace:
            if command:
                raise RecordError("--from-trace reads files: give no launch command")
            rec = recording_from_files(args.from_trace, args.skip_unknown)
        else:
            if not command:
                raise RecordError("no launch command: give it after '--', e.g. "
                                  "collective-record -o out.yaml -- python train.py")
            rec = _record(command, args)
        rec.world_sizes = args.world_size
        text = render(rec, build_programs if args.granularity == "program" else build)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    except (RecordError, TraceError) as e:
        print(f"collective-record: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"collective-record: error: {e.filename or args.output}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    state = "PARTIAL" if rec.partial else "complete"
    print(f"collective-record: {sum(c.count for c in rec.calls)} call(s) -> {args.output} "
          f"({state})")
    return 1 if rec.partial else 0


def _record(command: list[str], args: argparse.Namespace) -> Recording:
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
        for pattern in ("trace-*.jsonl", "trace-*.tally"):
            for old in args.trace_dir.glob(pattern):
                old.unlink()
        return _record_into(command, args, args.trace_dir)
    with tempfile.TemporaryDirectory(prefix="collective-record-") as tmp:
        return _record_into(command, args, Path(tmp))


def _record_into(command: list[str], args: argparse.Namespace, folder: Path) -> Recording:
    rc = _launch(command, folder, _hook(args.hook))
    traces = read_folder(folder)
    if not traces:
        raise RecordError(f"the launch command (exit status {rc}) made no collective call "
                          "after init_process_group: nothing to record")
    calls, unknown = translate_traces(traces, args.skip_unknown)
    world = max(t.world_size for t in traces)
    return Recording(world_size=world, calls=calls, source=" ".join(command),
                     partial=partial_notes(traces, rc, args.granularity == "program"),
                     unknown=unknown,
                     waits=wait_points(traces))


def wait_points(traces: list[RankTrace]) -> dict[int, list[tuple[int, int]]]:
    """Per rank, each seen wait as (calls issued before it, seq of the call it waited)."""
    return {t.rank: [(int(w.get("after", 0)), w["call"]) for w in t.waits
                     if type(w.get("call")) is int and type(w.get("after", 0)) is int]
            for t in traces}
