"""One lane of ``collective-fuzz --lanes N``: a whole fuzzer in a process of its own.

Started by the coordinator (:mod:`harness.fuzz.lanes`) as ``python -m harness.fuzz.worker``
with a pipe on each side. The first line it reads is its ``config``: the command line of the
run (already checked by the coordinator), its lane index and the number of lanes, its share
of ``--examples``. It then runs :class:`~harness.fuzz.session.Session` exactly as
``collective-fuzz`` runs one lane in process, with seed ``--seed + index`` (rounds stride by
the number of lanes), and sends what it finds, counts and digests as messages
(:mod:`harness.fuzz.wire`); the coordinator writes every file.

Its ends: the budget spent, or ``stop`` (another lane's first finding with
``--stop-at-first``): the fuzzer halts at its next example and the final tally goes out;
SIGINT or SIGTERM: the same, at once; EOF on its input (the coordinator is gone, even
SIGKILLed): it interrupts itself and closes its pools. Its rank processes die with it in any
case (they watch their owner, :mod:`harness.run.rank`).

Takes: its config on standard input. Gives: messages on standard output, nothing else (stray
prints go to standard error). Must not: write a file of the run, or outlive its coordinator.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import IO, Any

from . import space, wire
from .differential import BadReport, load_digests, text_key
from .engine import AlsoFails, Finding, Stats
from .execute import Ran
from .options import Usage, check, parser
from .session import Session
from .summary import PROG, Tally

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    return text[text.rindex(")") + 2:].split()  # fields from 3 (state) on


def descendants_cpu_s(root: int) -> float:
    """CPU seconds of every live descendant of ``root`` and of the children they reaped (a
    forkserver's ranks that ended); Linux /proc, 0.0 elsewhere. The rank side of a fuzzer:
    its forkserver, the ranks and the capability probes."""
    if not os.path.isdir("/proc"):
        return 0.0
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stats[int(entry)] = _stat(int(entry))
            except OSError:
                continue
    children: dict[int, list[int]] = {}
    for pid, f in stats.items():
        children.setdefault(int(f[1]), []).append(pid)
    total, todo = 0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        f = stats[pid]
        total += sum(int(x) for x in f[11:15])  # utime stime cutime cstime
        todo += children.get(pid, [])
    return total / TICK


class Channel:
    """The message pipe to the coordinator. Never raises into the fuzzer: once the
    coordinator is gone, messages are dropped (the input's EOF ends this process)."""

    def __init__(self, fd: int) -> None:
        self.out = os.fdopen(fd, "wb")
        self.gone = False

    def send(self, kind: str, **fields: Any) -> None:
        """Send one message (dropped once the pipe is broken)."""
        if self.gone:
            return
        try:
            self.out.write(wire.encode(kind, **fields))
            self.out.flush()
        except OSError:
            self.gone = True


class Interrupt:
    """The handler of SIGINT and SIGTERM: the lane ends Ctrl-C's way, once."""

    def __init__(self, halt: threading.Event, go: threading.Event) -> None:
        self.halt, self.go = halt, go
        self.seen = False

    def __call__(self, _signum: int, _frame: FrameType | None) -> None:
        if self.seen:  # Ctrl-C reaches the lane and the coordinator, which sends SIGTERM
            return  # too: the second must not cut the way out (tally, pools) short
        self.seen = True
        # Raised where Python cannot deliver it (a finalizer), KeyboardInterrupt is only
        # printed: the halt still ends the fuzzer at its next example.
        self.halt.set()
        self.go.set()
        raise KeyboardInterrupt


def _listen(commands: IO[bytes], session: Session, go: threading.Event,
            halt: threading.Event) -> None:
    """The coordinator's commands, until EOF; then this process interrupts itself."""
    while line := commands.readline(wire.MAX_LINE + 1):
        try:
            kind, fields = wire.decode(line)
        except wire.BadMessage as exc:
            print(f"{PROG} lane: ignored a bad command ({exc})", file=sys.stderr)
            continue
        if kind == "skip":  # a new set, never a change in place (the fuzzer reads it)
            session.fuzzer.skip = session.fuzzer.skip | {fields["signature"]}
        elif kind == "stop":
            halt.set()
            go.set()
        elif kind == "go":
            go.set()
    halt.set()
    go.set()
    os.kill(os.getpid(), signal.SIGTERM)


def _callbacks(channel: Channel, session_ref: list[Session], report: bool) -> dict[str, Any]:
    """The session's callbacks, as messages (``session_ref``: the session, once built)."""
    def on_finding(f: Finding) -> None:
        channel.send("finding", signature=f.signature, op=f.op, outcome=f.outcome,
                     text=space.render_case(f.case), message=f.message[:4000], seed=f.seed,
                     blob=f.blob, found_after_s=f.found_after_s,
                     found_after_examples=f.found_after_examples, shrink_s=f.shrink_s,
                     exception=f.exception[:300])

    def on_also(a: AlsoFails) -> None:
        channel.send("also", signature=a.signature, text=space.render_case(a.case),
                     message=a.message[:4000], confirm_outcome=a.confirm_outcome[:300],
                     confirm_message=a.confirm_message[:4000])

    def on_progress(_stats: Stats, note: str) -> None:
        channel.send("progress", tally=session_ref[0].tally().to_json(), note=note[:4000])

    def on_ran(text: str, ran: Ran) -> None:
        if report and ran.digests:
            channel.send("ran", key=text_key(text), digests=ran.digests)

    return {"on_finding": on_finding, "on_also": on_also, "on_progress": on_progress,
            "on_ran": on_ran}


def _pipes() -> tuple[int, IO[bytes]]:
    """Standard output and input, moved to descriptors no child inherits (a rank holding
    the message pipe would keep the coordinator from seeing this process end); stray output
    goes to standard error instead, and children read /dev/null."""
    out = os.dup(1)
    commands = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return out, commands


def main() -> int:
    """Entry point of a lane's worker process (exit 0, 130 when interrupted, 2 on a bad
    config, 1 on a harness error, whose traceback goes to standard error)."""
    go, halt = threading.Event(), threading.Event()
    interrupt = Interrupt(halt, go)
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    out, commands = _pipes()
    channel = Channel(out)
    session: Session | None = None
    interrupted = False
    cpu0 = ranks0 = 0.0
    try:
        kind, config = wire.decode(commands.readline(wire.MAX_LINE + 1))
        if kind != "config":
            raise wire.BadMessage(f"the first message is {kind!r}, not 'config'")
        args = parser().parse_args(config["argv"])
        ops = check(args)
        args.examples = config["examples"]
        digests = load_digests(args.against_report)[0] if args.against_report else None
        ref: list[Session] = []
        session = Session(args, ops, digests, lane=config["lane"], lanes=config["lanes"],
                          halt=halt.is_set, **_callbacks(channel, ref, bool(args.report)))
        ref.append(session)
        threading.Thread(target=_listen, args=(commands, session, go, halt),
                         name="coordinator", daemon=True).start()
        if config["lane"] == 0:
            for b in session.broken:
                channel.send("warning", text=f"--known: {b} (its overrides are not applied)"
                             [:4000])
        if config["warm"]:
            session.warm()
            channel.send("ready")
            go.wait()
            session.start_clock()  # every lane's --time from the common start
        times = os.times()
        cpu0, ranks0 = times.user + times.system, descendants_cpu_s(os.getpid())
        interrupted = session.run() or interrupt.seen
    except (wire.BadMessage, Usage, BadReport) as exc:
        print(f"{PROG} lane: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        interrupted = True
    finally:
        # From here on nothing interrupts the way out (the tally, then the pools closed), nor
        # kills the process while the interpreter finalizes (it restores the default
        # handlers then, and the coordinator's SIGTERM follows a Ctrl-C closely).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _end(channel, session, interrupted, cpu0, ranks0)
    return 130 if interrupted else 0


def _end(channel: Channel, session: Session | None, interrupted: bool, cpu0: float,
         ranks0: float) -> None:
    """The final tally (an empty one if interrupted before the fuzzer was built), then the
    pools closed."""
    if session is None and not interrupted:
        return  # a bad config: no tally; the exit status and stderr say why
    times = os.times()
    channel.send("end", tally=(session.tally() if session else Tally()).to_json(),
                 interrupted=interrupted, cpu_s=max(0.0, times.user + times.system - cpu0),
                 ranks_cpu_s=max(0.0, descendants_cpu_s(os.getpid()) - ranks0),
                 pools_started=sum(e.manager.started for e in session.executors)
                 if session else 0)
    if session is not None:
        session.close()


if __name__ == "__main__":
    raise SystemExit(main())
