"""What a rank's trace keeps of its calls: bounded in bytes and memory while it is written.

A long run issues millions of collectives, most of them the same few calls (a DDP bucket's
all_reduce every step). Writing one line per call grew a trace past the size its own reader
accepts (``trace.MAX_TRACE_BYTES``), so the whole recording was lost. :class:`Store` decides,
as each record arrives on the writer thread, what is written:

* **In order, every record**, while the trace is under ``WINDOW_BYTES``: the run's start,
  exactly as recorded (``--granularity program`` needs the order and the waits).
* **Then one record per distinct call**: a call whose *signature* (the op, every argument as
  recorded: each tensor's shape, stride, contiguity, dtype, device and layout, the group, the
  reduce op, the torch function, and the call site) was stored already is counted onto that
  record instead of written again; a wait of such a call is counted under (its call's
  signature, work or tensor, its site, how many calls came between). What this loses is only
  each repeat's own sequence number and thread name, i.e. where it fell in the order: the
  per-call case file (``--granularity call``) is the same as from a trace of every call.
* **Past a cap, counted but not stored**: a new signature past ``MAX_SIGNATURES`` distinct
  ones or past ``STORE_BYTES`` of trace, a line longer than the reader's ``MAX_LINE``, a wait
  key past the tally's ``TALLY_BYTES``. These are losses, named per op in the tally, and make
  the recording partial.

The counts live in a sidecar, ``trace-<pid>.tally`` (JSON lines), rewritten whole after the
trace lines it refers to are written (a new file renamed over the old, so a reader never sees
half of one), at most every ``FLUSH_SECONDS`` and at most a twentieth of the writer's time, and
always at exit; a SIGKILL leaves the tally of a recent flush, consistent with the trace. So a
trace stays under ``STORE_BYTES`` plus its header and end lines, and a tally under
``TALLY_BYTES``, both inside what :mod:`harness.record.trace` reads, by construction.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.record.capture import call_json, call_line, format_other, format_wait, resolve
from harness.record.trace import FORMAT, MAX_LINE, MAX_TRACE_BYTES, VERSION, tally_path

FLUSH_SECONDS = 0.5
RECENT = 1 << 14  # calls back a later wait can still be matched to its call's signature


@dataclass(frozen=True)
class Limits:
    """The caps; the defaults keep every file well inside the reader's limits."""

    window_bytes: int = 8 << 20  # records written in order while the trace is under this
    store_bytes: int = MAX_TRACE_BYTES // 4  # no call line is written past this (64 MiB)
    max_signatures: int = 1 << 14  # distinct calls stored
    tally_bytes: int = MAX_TRACE_BYTES // 16  # the tally's lines (16 MiB)


LIMITS = Limits()
_SAME_LINE = 64  # bytes a "same" tally line takes at most (two integers)
_WAIT_LINE = 100  # a "wait" tally line's bytes besides its site
_DROP_LINES = 1 << 20  # for the summary and "drop" lines (an op name and a reason each)


def size_text(n: int) -> str:
    """A cap as a person reads it: ``64 MiB``, or bytes where it is not whole MiB."""
    return f"{n >> 20} MiB" if n and not n % (1 << 20) else f"{n} bytes"


class Store:
    """Turns records (as :class:`harness.record.recorder.Recorder` keeps them) into the trace
    text to write (``text``) and the tally (:meth:`tally_text`).

    Lines are kept in ``text`` until the recorder has written them, so a failed write is tried
    again with nothing lost; their bytes count against the caps from the moment they are made.
    """

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self.text: list[str] = []
        self.bytes = 0  # trace bytes written or in ``text``
        self.ordered_until: int | None = None  # seq of the first call not stored in order
        self.sigs: dict[tuple[str, str], int] = {}  # (call JSON, site JSON) -> its record's seq
        self.recent: dict[int, int] = {}  # a call's seq -> its signature's seq
        self.newest = -1  # the highest call seq taken
        self.later: list[Any] = []  # waits that came before their call: the next batch's
        self.same: dict[int, int] = {}  # signature seq -> repeats counted onto it
        # (signature seq, "work" | "tensor", calls between, site JSON) -> waits counted
        self.waits: dict[tuple[int, str, int, str], int] = {}
        self.dropped: dict[tuple[str, str], int] = {}  # (op, why) -> calls not stored
        self.waits_dropped: dict[str, int] = {}  # why -> waits not stored
        self.seen = 0  # calls
        self.stored = 0  # call records written
        self.wait_bytes = 0  # the tally's "wait" lines
        # what the tally leaves them: its "same" lines (one per signature) and the rest are
        # bounded apart, so the tally stays under tally_bytes by construction
        self.wait_budget = limits.tally_bytes - limits.max_signatures * _SAME_LINE - _DROP_LINES
        self.dirty = False  # the tally changed since it was last written
        self.next_tally = 0.0

    def add_batch(self, records: Iterable[Any], final: bool = False) -> None:
        """Take a batch of records, its waits after its calls: the C++ kernel queues its calls
        apart from the waits, which can reach the batch first, and a wait is counted under its
        call's signature. A wait whose call is not here yet waits for the next batch (``final``:
        there is none)."""
        waits, self.later = self.later, []
        for record in records:
            if type(record) is tuple and type(record[0]) is not str:
                waits.append(record)
            else:
                self.add(record)
        for record in waits:
            self.add(record)
        if final:  # the process is leaving: a call still unseen will not come
            for _ in self.later:
                self._drop_wait("its call was never seen")
            self.later = []
        if len(self.recent) > 2 * RECENT:  # only between batches: a batch's waits come last
            floor = self.newest - RECENT
            self.recent = {s: g for s, g in self.recent.items() if s > floor}

    def add(self, record: Any) -> None:
        """Take one record: a header/end/stop dict, a call tuple or a wait tuple."""
        if type(record) is dict:
            self._keep(format_other(record) + "\n")
        elif type(record[0]) is str:
            self._call(*record)
        else:
            self._wait(*record)

    def _keep(self, line: str) -> None:
        self.text.append(line)
        self.bytes += len(line)

    def _remember(self, seq: int, sig: int) -> None:
        self.recent[seq] = sig

    def _drop(self, op: str, why: str) -> None:
        self.dropped[(op, why)] = self.dropped.get((op, why), 0) + 1
        self.dirty = True

    def _call(self, op: str, args: Any, api: str | None, site: str, thread: str,
              seq: int) -> None:
        self.seen += 1
        self.newest = max(self.newest, seq)
        static = call_json(op, resolve(args), api)
        key = (static, site)
        sig = self.sigs.get(key)
        lim = self.limits
        if self.ordered_until is None:
            line = call_line(static, site, thread, seq) + "\n"
            if len(line) > MAX_LINE:
                self._drop(op, f"its record is longer than the reader's {MAX_LINE >> 20} MiB "
                               "line limit")
                return
            if self.bytes + len(line) <= lim.window_bytes:
                self._keep(line)
                self.stored += 1
                if sig is None and len(self.sigs) < lim.max_signatures:
                    sig = self.sigs[key] = seq
                if sig is not None:
                    self._remember(seq, sig)
                return
            self.ordered_until = seq  # the window is full: one record per distinct call now
            self.dirty = True
        if sig is not None:
            self.same[sig] = self.same.get(sig, 0) + 1
            self._remember(seq, sig)
            self.dirty = True
            return
        line = call_line(static, site, thread, seq) + "\n"
        if len(self.sigs) >= lim.max_signatures:
            self._drop(op, f"past the cap of {lim.max_signatures} distinct calls")
        elif len(line) > MAX_LINE:
            self._drop(op, f"its record is longer than the reader's {MAX_LINE >> 20} MiB line "
                           "limit")
        elif self.bytes + len(line) > lim.store_bytes:
            self._drop(op, f"past the trace's cap of {size_text(lim.store_bytes)}")
        else:
            self._keep(line)
            self.stored += 1
            self.sigs[key] = seq
            self._remember(seq, seq)

    def _wait(self, seq: int | None, what: str, after: int, site: str) -> None:
        if len(site) + _WAIT_LINE > MAX_LINE:  # a stack frame's file name of a megabyte
            self._drop_wait(f"its site is longer than the reader's {MAX_LINE >> 20} MiB line "
                            "limit")
            return
        if self.ordered_until is None:
            line = format_wait(seq, what, after, site) + "\n"
            if self.bytes + len(line) <= self.limits.window_bytes:
                self._keep(line)
                return
            self.ordered_until = after  # every call before this wait was kept in order
            self.dirty = True
        if seq is None:  # a wait_tensor of no recorded call: no case uses it, nothing lost
            return
        sig = self.recent.get(seq)
        if sig is None and seq > self.newest and len(self.later) < RECENT:
            # its call is still in the C++ kernel's queue (queued just after the batch began)
            self.later.append((seq, what, after, site))
            return
        if sig is None:
            self._drop_wait(f"its call was not stored or was more than {RECENT} calls back")
            return
        key = (sig, what, max(0, after - seq - 1), site)
        n = self.waits.get(key)
        if n is None:
            size = len(site) + _WAIT_LINE
            if self.wait_bytes + size > self.wait_budget:
                self._drop_wait(f"past the tally's cap of {size_text(self.limits.tally_bytes)}")
                return
            self.wait_bytes += size
            n = 0
        self.waits[key] = n + 1
        self.dirty = True

    def _drop_wait(self, why: str) -> None:
        self.waits_dropped[why] = self.waits_dropped.get(why, 0) + 1
        self.dirty = True

    def tally_text(self) -> str:
        """The tally file's text: a summary line, then one line per count."""
        head = {"format": FORMAT, "version": VERSION, "seen": self.seen, "stored": self.stored,
                "ordered_until": self.ordered_until}
        lines = [format_other({"tally": head})]
        lines += [f'{{"same":[{s},{n}]}}' for s, n in self.same.items()]
        lines += [f'{{"wait":[{s},"{what}",{d},{site},{n}]}}'
                  for (s, what, d, site), n in self.waits.items()]
        lines += [format_other({"drop": [op, why, n]}) for (op, why), n in self.dropped.items()]
        lines += [format_other({"drop_waits": [why, n]}) for why, n in self.waits_dropped.items()]
        return "\n".join(lines) + "\n"

    def write_tally(self, trace: Path, force: bool = False) -> None:
        """Write the tally next to ``trace`` if it changed; unless ``force``, at most every
        FLUSH_SECONDS and at most a twentieth of the time (a tally of thousands of lines
        rewritten at every flush would slow the run it records)."""
        if not self.dirty or (not force and time.monotonic() < self.next_tally):
            return
        start = time.monotonic()
        final = tally_path(trace)
        tmp = final.with_name("." + final.name + ".tmp")
        tmp.write_text(self.tally_text(), encoding="utf-8")
        os.replace(tmp, final)
        self.dirty = False
        took = time.monotonic() - start
        self.next_tally = start + max(FLUSH_SECONDS, 20 * took)
