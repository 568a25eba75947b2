"""``collective-record``: run a launch command with the recorder, write the case file.

Exit status: 0 the case file is written from a complete run; 1 it is written but the run was
partial (the command failed or a rank stopped early: the file says so); 2 bad input (an
unreadable trace, an op the op table lacks, a bad option), one line on stderr, no file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
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
                   help="keep the per-rank traces here (default: a temporary folder)")
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
        native.load()
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


def translate_traces(traces: list[RankTrace], skip_unknown: bool
                     ) -> tuple[list[Call], list[str]]:
    """Every rank's calls in the case vocabulary, waits attached; unknown ops raise
    RecordError (or are returned as lines with ``skip_unknown``)."""
    calls: list[Call] = []
    unknown: list[str] = []
    for t in traces:
        waited = {w["call"]: f"at {Path(str(w.get('site', '?'))).name} after "
                  f"{max(0, int(w.get('after', 0)) - int(w['call']) - 1)} later call(s)"
                  for w in t.waits if type(w.get("call")) is int}
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
            for c in out:
                w = waited.get(c.seq)
                calls.append(c if w is None else Call(**{**c.__dict__, "waited": w}))
    return calls, unknown


def partial_notes(traces: list[RankTrace], rc: int | None) -> list[str]:
    """One line per way the recording is incomplete (empty: complete)."""
    notes = []
    if rc:
        notes.append(f"the launch command exited with status {rc}")
    world = max((t.world_size for t in traces), default=0)
    missing = sorted(set(range(world)) - {t.rank for t in traces})
    if missing:
        notes.append(f"ranks {missing} wrote no trace")
    for t in traces:
        if not t.ended:
            last = _where(t.calls[-1]) if t.calls else "no call"
            notes.append(f"rank {t.rank} stopped after {len(t.calls)} call(s); last: {last}"
                         + (f" ({t.truncated})" if t.truncated else ""))
        elif rc and t.calls:
            notes.append(f"rank {t.rank} made {len(t.calls)} call(s) before the run failed; "
                         f"last: {_where(t.calls[-1])}")
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
    print(f"collective-record: {len(rec.calls)} call(s) -> {args.output} ({state})")
    return 1 if rec.partial else 0


def _record(command: list[str], args: argparse.Namespace) -> Recording:
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
        for old in args.trace_dir.glob("trace-*.jsonl"):
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
                     partial=partial_notes(traces, rc), unknown=unknown,
                     waits=wait_points(traces))


def wait_points(traces: list[RankTrace]) -> dict[int, list[tuple[int, int]]]:
    """Per rank, each seen wait as (calls issued before it, seq of the call it waited)."""
    return {t.rank: [(int(w.get("after", 0)), w["call"]) for w in t.waits
                     if type(w.get("call")) is int and type(w.get("after", 0)) is int]
            for t in traces}
