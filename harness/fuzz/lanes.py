"""Lanes: ``collective-fuzz --lanes N`` as N worker processes, each a whole fuzzer.

Most of an instance's wall time on a small machine is deliberate waiting that uses no CPU
(probe delays, settle polls, the wait before a stranded rank is declared blocked, programs'
sleeps), and the fuzzer's own Python work holds one interpreter's lock. So a lane is a
process of its own (:mod:`harness.fuzz.worker`): its own Hypothesis engine, executors and
rank pools, seed ``--seed + index``, its share of ``--examples``; lanes never wait for each
other. This coordinator starts them, reads their messages (:mod:`harness.fuzz.wire`: JSON
lines, checked), prints the progress and the summary added up over lanes, and writes every
case file itself: a signature found by two lanes is written once (the first), and the other
lanes are told to skip it.

Ends: the lanes' budgets spent; ``--stop-at-first``: the first finding stops every lane;
Ctrl-C or SIGTERM: every lane is sent SIGTERM and its final tally is awaited (at most
:data:`DRAIN_S`; a second signal kills them); a lane interrupted from outside interrupts the
run the same way. A lane that dies, or sends a malformed message (it is then killed), is reported in
one line with its exit and the tail of its standard error; the others go on, and the run's
status says it is incomplete.

Takes: the checked options and the command line. Gives: the merged tally, findings, "also
fails" records and digests. Must not: let a worker or a rank outlive :meth:`Coordinator.run`,
or trust anything a worker writes beyond data checked against its schema.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..casefile import load
from ..errors import CaseFileError
from ..report.jsonfile import printable
from . import wire
from .engine import AlsoFails, Finding, Stats
from .findings import write_also, write_case
from .options import backend_options, confirm_label, reproduce_command
from .summary import PROG, Tally, progress_line, summary

DRAIN_S = 60.0  # after a stop or an interrupt: time for a lane to send its tally and close
PROGRESS_S = 1.0
SOURCE = str(Path(__file__).resolve().parents[2])  # the tree this harness runs from


def shares(examples: int | None, lanes: int) -> list[int | None]:
    """Each lane's part of ``--examples`` (they add up to it; no lane gets none)."""
    if examples is None:
        return [None] * lanes
    n = min(lanes, examples)
    return [examples // n + (1 if k < examples % n else 0) for k in range(n)]


@dataclass
class Lane:
    """One worker process and what it has said."""

    index: int
    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    buf: bytearray = field(default_factory=bytearray)
    tally: Tally = field(default_factory=Tally)  # its latest
    open: bool = True  # its output has not reached EOF
    ended_at: float | None = None  # when its final tally came
    ready: bool = False
    interrupted: bool = False
    cpu_s: float = 0.0
    ranks_cpu_s: float = 0.0
    pools_started: int = 0
    problem: str = ""

    @property
    def name(self) -> str:
        """How messages name it: ``lane 1 (pid 1234)``."""
        return f"lane {self.index} (pid {self.proc.pid})"


def key_of(lane: Lane) -> IO[bytes]:
    """What ``lane`` is registered under in the selector (its output pipe)."""
    assert lane.proc.stdout is not None
    return lane.proc.stdout


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


class Coordinator:
    """Starts the lanes, handles their messages, and adds up what they found."""

    def __init__(self, args: argparse.Namespace, argv: list[str], warm: bool = False,
                 command: list[str] | None = None) -> None:
        self.args = args
        self.argv = argv
        self.warm = warm  # each lane starts its pools, says "ready" and waits for go()
        # A lane's process (tests give stand-ins that misbehave on purpose).
        self.command = command or [sys.executable, "-m", "harness.fuzz.worker"]
        self.shares = shares(args.examples, args.lanes)
        self.lanes: list[Lane] = []
        self.started = time.monotonic()
        self.findings: dict[str, Finding] = {}
        self.also: dict[str, AlsoFails] = {}
        self.digests: dict[str, dict[str, str]] = {}
        self.taken: set[str] = set()
        self.interrupted = False
        self.drain_until: float | None = None
        self._selector = selectors.DefaultSelector()
        self._last_progress = time.monotonic()  # the first line once there is something

    def start(self) -> None:
        """Start every lane's worker process and send it its config."""
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(p for p in (SOURCE, os.environ.get("PYTHONPATH"))
                                             if p)}
        for k, share in enumerate(self.shares):
            err = tempfile.TemporaryFile()  # noqa: SIM115 (closed with its lane: _closed)
            proc = subprocess.Popen(self.command, env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
            lane = Lane(k, proc, err)
            self.lanes.append(lane)
            os.set_blocking(key_of(lane).fileno(), False)
            self._selector.register(key_of(lane), selectors.EVENT_READ, lane)
            self._send(lane, "config", argv=self.argv, lane=k, lanes=len(self.shares),
                       examples=share, warm=self.warm)

    def _send(self, to: Lane, kind: str, **fields: Any) -> None:
        if to.proc.stdin is None or not to.open:
            return
        with contextlib.suppress(OSError):  # it is gone: its EOF says how
            to.proc.stdin.write(wire.encode(kind, **fields))
            to.proc.stdin.flush()

    def wait_ready(self) -> None:
        """Wait until every lane is warm (``warm=True``) or has ended."""
        while any(lane.open and not lane.ready for lane in self.lanes):
            self._pump(0.5)

    def go(self) -> None:
        """Let warm lanes start fuzzing."""
        for lane in self.lanes:
            self._send(lane, "go")

    def stop(self) -> None:
        """Ask every lane to end at its next example (its final tally still comes)."""
        for lane in self.lanes:
            self._send(lane, "stop")
        self.drain_until = self.drain_until or time.monotonic() + DRAIN_S

    def _interrupt(self) -> None:
        self.interrupted = True
        for lane in self.lanes:
            if lane.open:
                with contextlib.suppress(ProcessLookupError):
                    lane.proc.send_signal(signal.SIGTERM)
        self.drain_until = time.monotonic() + DRAIN_S

    def run(self) -> None:
        """Run every lane to its end. SIGINT or SIGTERM (Ctrl-C) stops them all and waits for
        their tallies; a second one kills them. No worker outlives this."""
        signals: list[int] = []
        # The handlers only count: an exception raised where Python cannot deliver it (a
        # finalizer) would be printed and lost, and the lanes would go on.
        old = {s: signal.signal(s, lambda signum, _frame: signals.append(signum))
               for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if not self.lanes:
                self.start()
            while any(lane.open for lane in self.lanes):
                if len(signals) > 1:
                    self._kill_all("killed after a second interrupt")
                elif signals and not self.interrupted:
                    self._interrupt()
                self._pump(0.5)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
            self._kill_all("killed: the coordinator ended first (a harness error)")
        if signals:
            self.interrupted = True

    def _kill_all(self, why: str) -> None:
        for lane in self.lanes:
            if lane.open:
                self._kill(lane, why)

    def _kill(self, lane: Lane, why: str) -> None:
        lane.problem = lane.problem or why
        with contextlib.suppress(ProcessLookupError):
            lane.proc.kill()  # its ranks watch it and end with it
        self._closed(lane)

    def _pump(self, timeout: float) -> None:
        self._take(self._selector.select(timeout))
        if self.drain_until is not None and time.monotonic() > self.drain_until:
            self._kill_all(f"did not end within {DRAIN_S:.0f} s of being stopped; killed")
        self._progress()

    def _take(self, ready: list[tuple[selectors.SelectorKey, int]]) -> None:
        for key, _ in ready:
            lane: Lane = key.data
            try:
                data = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                self._closed(lane)
                continue
            lane.buf += data
            while lane.open and (nl := lane.buf.find(b"\n")) >= 0:
                line = bytes(lane.buf[:nl])
                del lane.buf[:nl + 1]
                self._handle(lane, line)
            if lane.open and len(lane.buf) > wire.MAX_LINE:
                self._kill(lane, f"sent a line of more than {wire.MAX_LINE} bytes; ended it")

    def _closed(self, lane: Lane) -> None:
        """``lane``'s output is at EOF: reap it and say what went wrong, if anything."""
        lane.open = False
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(key_of(lane))
        try:
            code = lane.proc.wait(DRAIN_S)
        except subprocess.TimeoutExpired:
            lane.proc.kill()
            code = lane.proc.wait()
            lane.problem = lane.problem or "closed its output but did not exit; killed"
        if not lane.problem and lane.ended_at is None and not (
                self.interrupted and code in (-signal.SIGINT, -signal.SIGTERM)):
            # (the exception: ended by the interrupt before its handler was set, at its
            # start: no fuzzer yet, so nothing to tally)
            lane.problem = f"ended with {_exit(code)} before sending its final tally"
        elif not lane.problem and code not in (0, 130):
            lane.problem = f"ended with {_exit(code)} after its final tally"
        for pipe in (lane.proc.stdin, lane.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if lane.problem:
            lane.problem += self._tail(lane)
            print(f"{PROG}: error: {lane.name} {lane.problem}; the other lanes go on and the "
                  "run will end incomplete (exit 3); if this is not a kill of yours, rerun "
                  "with --lanes 1 to see the error in full", file=sys.stderr, flush=True)
        lane.stderr.close()

    def _tail(self, lane: Lane) -> str:
        try:
            lane.stderr.seek(max(0, lane.stderr.seek(0, os.SEEK_END) - 4096))
            lines = [x for x in lane.stderr.read().decode("utf-8", "replace").splitlines()
                     if x.strip()]
        except (OSError, ValueError):
            return ""
        return f" (stderr: {printable(' | '.join(lines[-3:]), 400)})" if lines else ""

    def _handle(self, lane: Lane, line: bytes) -> None:
        try:
            kind, m = wire.decode(line)
            if kind == "progress":
                lane.tally = Tally.from_json(m["tally"])
                if m["note"]:
                    self._progress(f"lane {lane.index}: {m['note']}")
            elif kind == "ran":
                self.digests[m["key"]] = m["digests"]
            elif kind == "finding":
                self._finding(lane, m)
            elif kind == "also":
                self._also(lane, m)
            elif kind == "end":
                self._end(lane, m)
            elif kind == "ready":
                lane.ready = True
            elif kind == "warning":
                print(f"{PROG}: warning: {printable(m['text'], 300)}", file=sys.stderr)
            else:
                raise wire.BadMessage(f"{kind!r} is a command, not a report")
        except wire.BadMessage as exc:
            self._kill(lane, f"sent a malformed message ({printable(exc, 300)}); ended it")

    def _case(self, lane: Lane, text: str) -> dict[str, Any]:
        """The one case of a document a lane says it ran, read as hostile input (the
        bounded case-file parser; plain data only)."""
        try:
            data = load.load_text(text, f"lane {lane.index}'s case").data
        except CaseFileError as exc:
            raise wire.BadMessage(f"its case document does not load: {exc}") from None
        cases = data.get("cases") if isinstance(data, dict) else None
        if not (isinstance(cases, list) and len(cases) == 1 and isinstance(cases[0], dict)):
            raise wire.BadMessage("its case document does not hold exactly one case")
        return dict(cases[0])

    def _finding(self, lane: Lane, m: dict[str, Any]) -> None:
        f = Finding(m["signature"], m["op"], m["outcome"], self._case(lane, m["text"]),
                    m["message"], m["seed"], m["blob"], m["found_after_s"],
                    m["found_after_examples"], m["shrink_s"], lane=lane.index,
                    exception=m["exception"])
        first = self.findings.get(f.signature)
        if first is not None:  # found by two lanes before the skip reached the second
            first.again += 1
            self._progress(f"lane {lane.index}: found {f.signature} again (written once: "
                           f"{first.path})")
            return
        write_case(f, Path(self.args.out), self.args.backend, reproduce_command(self.args),
                   self.taken, backend_options(self.args))
        self.findings[f.signature] = f
        for other in self.lanes:
            if other is not lane:
                self._send(other, "skip", signature=f.signature)
        if self.args.stop_at_first:
            self.stop()

    def _also(self, lane: Lane, m: dict[str, Any]) -> None:
        if m["signature"] in self.also:
            return  # counted in the lanes' tallies
        a = AlsoFails(m["signature"], self._case(lane, m["text"]), m["message"],
                      m["confirm_outcome"], m["confirm_message"])
        write_also(a, Path(self.args.out), self.args.backend, confirm_label(self.args),
                   self.taken)
        self.also[a.signature] = a

    def _end(self, lane: Lane, m: dict[str, Any]) -> None:
        lane.tally = Tally.from_json(m["tally"])
        lane.ended_at = time.monotonic()
        lane.interrupted = m["interrupted"]
        lane.cpu_s, lane.ranks_cpu_s = m["cpu_s"], m["ranks_cpu_s"]
        lane.pools_started = m["pools_started"]
        if lane.interrupted and not self.interrupted:
            self._interrupt()  # SIGINT or SIGTERM to a lane alone: the run is interrupted

    def tally(self) -> Tally:
        """The lanes' tallies added up (the rate from this coordinator's start)."""
        total = Tally(Stats(started=self.started))
        for lane in self.lanes:
            total.add(lane.tally)
        return total

    def _progress(self, note: str = "") -> None:
        now = time.monotonic()
        if self.args.quiet or not (note or now - self._last_progress >= PROGRESS_S):
            return
        total = self.tally()
        if note or total.stats.tried:  # nothing to say before a lane has run something
            self._last_progress = now
            print(progress_line(total.stats, note, len(self.findings)), file=sys.stderr,
                  flush=True)

    def failed(self) -> list[Lane]:
        """The lanes that died, were killed or misbehaved."""
        return [lane for lane in self.lanes if lane.problem]

    def summary(self, differ_label: str | None) -> str:
        """The summary added up over lanes, then one line per lane."""
        total = self.tally()
        also = list(self.also.values())
        for a in also:
            a.count = max(1, total.also[a.signature])
        failed = self.failed()
        state = ("interrupted" if self.interrupted
                 else f"incomplete: {len(failed)} lane(s) failed" if failed else "")
        text = summary(total, list(self.findings.values()), also, differ_label,
                       self.args.confirm_against is not None, state)
        lines = [f"  lanes: {len(self.lanes)} worker processes, seed {self.args.seed} + lane "
                 "(each round strides by the number of lanes): " + ", ".join(
                     f"{lane.name} {lane.tally.stats.tried} instances" for lane in self.lanes)]
        lines += [f"  LANE FAILED {lane.name}: {lane.problem}" for lane in failed]
        return "\n".join([text, *lines])

    def status(self) -> int:
        """130 interrupted, 3 a lane failed (the run is incomplete), 1 findings, else 0."""
        if self.interrupted:
            return 130
        return 3 if self.failed() else (1 if self.findings else 0)
