"""A rank's trace file: records kept in memory, written in batches, flushed on the way out.

Records are kept in memory and written in batches (every ``FLUSH_RECORDS`` records, and by a
daemon thread every ``FLUSH_SECONDS``), so a call costs a list append of a small tuple, not a
write: the JSON text is made when a batch is written (see :mod:`harness.record.capture`). What
a dying process has not written yet is written on the way out: at exit (atexit), in
``os._exit`` (wrapped by the hook), and on SIGTERM/SIGHUP (when their action is the default:
the flusher thread is woken through the signal wakeup fd, so a rank blocked in a collective is
flushed too, then dies by the signal as it would have). Only a SIGKILL or a crash in C++ can
lose records: at most the last ``FLUSH_SECONDS``.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import select
import signal
import sys
import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist

from harness.record.capture import format_call, format_other, format_wait
from harness.record.trace import FORMAT, VERSION

FLUSH_RECORDS = 512  # a batch is written once this many records are waiting ...
FLUSH_SECONDS = 0.5  # ... or by the flusher thread this often, whichever comes first
SIGNALS = ("SIGTERM", "SIGHUP")  # flushed, then the default action (the process dies)


def _line(record: Any) -> str:
    if type(record) is dict:
        return format_other(record)
    if type(record[0]) is str:  # a call starts with its JSON text, a wait with a seq or None
        return format_call(record)
    return format_wait(*record)


class Recorder:
    """Writes this process's calls as JSON lines, one record per line.

    ``buf`` holds records not written yet: a call tuple (:data:`capture.CallTuple`), a wait
    tuple ``(call seq or None, "work" | "tensor", calls so far, site JSON)``, or a header/end
    dict: strings and ints, which the cyclic GC stops tracking (see :mod:`capture`).
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.out: TextIO | None = None
        self.buf: list[Any] = []
        self.seq = itertools.count()
        self.calls = 0
        self.lock = threading.Lock()
        self.local = threading.local()
        # id(pybind Work) -> (seq, the Work); an OrderedDict so forgetting the oldest is O(1)
        self.works: OrderedDict[int, tuple[int, Any]] = OrderedDict()
        # a functional collective's async output tensor -> its call, for wait_tensor
        self.tensors: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.tensor_seq: OrderedDict[int, int] = OrderedDict()
        self.wake: int = -1  # read end of the signal wakeup pipe, when there is one
        self.opened = False  # a record written after close() appends, never truncates

    def depth(self) -> int:
        """How deep this thread is inside recorded calls (0: a call now is the user's)."""
        return int(getattr(self.local, "depth", 0))

    def emit(self, record: Any) -> None:
        """Keep one record; write the batch when it is full."""
        with self.lock:
            if not self.opened and not self.buf:
                self.buf.append({"header": self.header()})
            self.buf.append(record)
            if len(self.buf) >= FLUSH_RECORDS:
                self._write()

    def flush(self) -> None:
        """Write what is kept."""
        with self.lock:
            self._write()

    def _write(self) -> None:  # the lock is held
        if not self.buf:
            return
        if self.out is None:
            self.open()
        assert self.out is not None
        self.out.write("".join(_line(r) + "\n" for r in self.buf))
        self.out.flush()
        self.buf.clear()

    def header(self) -> dict[str, Any]:
        """The header line, taken at the first record (the group may be gone by the time a
        batch is written)."""
        rank = dist.get_rank() if dist.is_initialized() else -1
        world = dist.get_world_size() if dist.is_initialized() else -1
        return {"format": FORMAT, "version": VERSION, "torch": torch.__version__, "rank": rank,
                "world_size": world, "pid": os.getpid(), "argv": sys.argv[:8]}

    def open(self) -> None:
        """Open this process's trace file (truncated the first time, appended after)."""
        path = Path(self.folder) / f"trace-{os.getpid()}.jsonl"
        self.out = path.open("a" if self.opened else "w", encoding="utf-8")
        self.opened = True

    def close(self) -> None:
        """Write the end record and what is left, close the file."""
        with self.lock:
            if self.out is not None or self.buf:
                self.buf.append({"end": {"calls": self.calls}})
                self._write()
            if self.out is not None:
                self.out.close()
                self.out = None

    def after_fork(self) -> None:
        """A forked child writes its own trace: the parent's file and batch are not its; it
        gets its own wakeup pipe (the parent's is shared) and its own flusher thread."""
        self.lock = threading.Lock()
        self.out, self.buf, self.opened = None, [], False
        if self.wake >= 0:
            os.close(self.wake)
            self.wake = -1
            r, w = os.pipe()
            os.set_blocking(w, False)
            signal.set_wakeup_fd(w, warn_on_full_buffer=False)  # the forking thread is main
            self.wake = r
        start_flusher(self)

    def flusher(self) -> None:
        """The daemon thread: a batch every FLUSH_SECONDS; on a signal, flush and die by it."""
        while True:
            if self.wake >= 0:
                ready = select.select([self.wake], [], [], FLUSH_SECONDS)[0]
            else:
                ready = []
                time.sleep(FLUSH_SECONDS)
            self.flush()
            if ready:
                got = os.read(self.wake, 64)
                for sig in (getattr(signal, n) for n in SIGNALS):
                    if sig in got:
                        die_by(self, sig)


def die_by(rec: Recorder, sig: int) -> None:
    """Flush, then take the signal's default action (from any thread)."""
    rec.flush()
    ctypes.CDLL(None).signal(sig, 0)  # SIG_DFL, set from any thread
    os.kill(os.getpid(), sig)


def start_flusher(rec: Recorder) -> None:
    """Start the daemon thread that writes a batch every FLUSH_SECONDS."""
    threading.Thread(target=rec.flusher, name="collective-record-flush", daemon=True).start()


def install_signals(rec: Recorder) -> None:
    """SIGTERM/SIGHUP whose action is the default: flush first. Done only from the main thread
    and only where no wakeup fd is set (asyncio's, say); else the flusher's timer is all."""
    if threading.current_thread() is not threading.main_thread():
        return
    mine = [s for s in (getattr(signal, n) for n in SIGNALS)
            if signal.getsignal(s) == signal.SIG_DFL]
    if not mine:
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    if signal.set_wakeup_fd(w, warn_on_full_buffer=False) != -1:
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)
        return
    rec.wake = r

    def on_signal(signum: int, frame: Any) -> None:
        die_by(rec, signum)

    for s in mine:
        signal.signal(s, on_signal)
