"""A rank's trace file: records kept in memory, written in batches, flushed on the way out.

Records are kept in memory and written in batches by a daemon thread every ``FLUSH_SECONDS``,
so a call costs a deque append of a small tuple on the rank's own thread, not a write: the
JSON text is made when a batch is written, on the writer's thread (see
:mod:`harness.record.capture`), and what of it is written (every record while the trace is
small, then one record per distinct call, counted) is :mod:`harness.record.store`'s call. Only
past ``MAX_KEPT`` waiting records does a recording thread write the batch itself, which
bounds the memory when the writer falls behind. What a dying process has not written yet is
written on the way out: at exit (atexit, then an ``end`` record), in ``os._exit`` (wrapped by
the hook) and on SIGTERM/SIGHUP (when their action is the default: the flusher thread is woken
through the signal wakeup fd, so a rank blocked in a collective is flushed too, then dies by
the signal as it would have), each then a ``stop`` record saying how. Only a SIGKILL or a
crash in C++ can lose records, at most the last ``FLUSH_SECONDS``; such a trace has neither
record, and the reader says its end is unknown.
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
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from harness.record.native import records
from harness.record.store import FLUSH_SECONDS, Store
from harness.record.trace import FORMAT, VERSION

MAX_KEPT = 1 << 16  # records waiting past which a recording thread writes them itself
MAX_PENDING = 4096  # Works kept to match a later wait(); the oldest forgotten past this
SIGNALS = ("SIGTERM", "SIGHUP")  # flushed, then the default action (the process dies)
ARGV_CHARS = 1000  # of each argument the header keeps: its line stays far under MAX_LINE


class Recorder:
    """Writes this process's calls as JSON lines, one record per line.

    ``buf`` holds records not written yet: a call tuple (:data:`capture.CallTuple`), a wait
    tuple ``(call seq or None, "work" | "tensor", calls so far, site JSON)``, or a header/end
    dict: nothing the cyclic GC keeps tracking (see :mod:`capture`). Appends and pops of a
    deque are atomic, so recording threads append without the lock; the lock orders writers.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.out: TextIO | None = None
        self.path: Path | None = None
        self.store = Store()
        self.buf: deque[Any] = deque()
        self.started = False  # the header is taken at the first record
        self.seq = itertools.count()
        self.calls = 0
        self.lock = threading.RLock()  # RLock: a pull while writing may take the header
        self.local = threading.local()
        self.native: Any = None  # the C++ kernel's module, when it records the c10d ops
        self.hook_note = ""  # why the C++ kernel was asked for and is not used, if it was
        # id(pybind Work) -> (seq, the Work); an OrderedDict so forgetting the oldest is O(1)
        self.works: OrderedDict[int, tuple[int, Any]] = OrderedDict()
        # (seq, the Work as the dispatcher returned it), not unboxed yet: see adopt_works
        self.new_works: deque[tuple[int, Any]] = deque()
        # a functional collective's async output tensor -> its call, for wait_tensor
        self.tensors: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.tensor_seq: OrderedDict[int, int] = OrderedDict()
        self.wake: int = -1  # read end of the signal wakeup pipe, when there is one
        self.opened = False  # a record written after close() appends, never truncates

    def depth(self) -> int:
        """How deep this thread is inside recorded calls (0: a call now is the user's)."""
        return int(getattr(self.local, "depth", 0))

    def emit(self, record: Any) -> None:
        """Keep one record (the flusher thread writes it)."""
        if not self.started:
            self.start()
        if self.native is not None and type(record) is tuple and type(record[0]) is str:
            with self.lock:  # the calls the C++ kernel queued come first: calls stay in order
                self.pull()
                self.buf.append(record)
        else:
            self.buf.append(record)
        if len(self.buf) >= MAX_KEPT:
            self.flush()

    def start(self) -> None:
        """Take the header: at the first record, while the group still exists."""
        with self.lock:
            if not self.started:
                self.buf.append({"header": self.header()})
                self.started = True

    def next_seq(self) -> int:
        """The next call's sequence number (shared with the C++ kernel)."""
        return int(self.native.next_seq()) if self.native is not None else next(self.seq)

    def count_call(self) -> None:
        """Count one recorded call."""
        if self.native is not None:
            self.native.count_call()
        else:
            self.calls += 1

    def call_count(self) -> int:
        """How many calls were recorded so far."""
        return int(self.native.call_count()) if self.native is not None else self.calls

    def pull(self) -> None:
        """Move what the C++ kernel queued into ``buf`` (and its Works to adopt)."""
        if self.native is None:
            return
        for call, seq, work in records(self.native):
            if call is not None:
                self.buf.append(call)
            if work is not None:
                self.new_works.append((seq, work))

    def take_works(self) -> None:
        """Move the Works of the calls the C++ kernel queued to ``new_works``."""
        if self.native is not None:
            self.new_works.extend(self.native.take_works())

    def find_work(self, key: int) -> tuple[int, Any] | None:
        """The call of a Work whose ``wait()`` found no entry: the Works still queued or being
        moved are adopted first, under the lock the writer holds while it moves them (a wait
        between the two steps would otherwise find the Work in neither place)."""
        with self.lock:
            self.take_works()
            self.adopt_works()
            return self.works.pop(key, None)

    def adopt_works(self) -> None:
        """Unbox the Works recorded calls returned, so that a ``wait()`` on one finds its call.

        Done off the recording thread (by the flusher, or by a ``wait()`` that finds no entry):
        pybind hands out one Python object per C++ Work while one is alive, and the user's is
        alive for as long as it can be waited, so unboxing later still finds the same object.
        """
        new, works = self.new_works, self.works
        while new:
            try:
                seq, work = new.popleft()
            except IndexError:  # another thread took the last one
                break
            pw = work if type(work) is c10d.Work else c10d.Work.unbox(work)
            works[id(pw)] = (seq, pw)
        while len(works) > MAX_PENDING:
            works.popitem(last=False)

    def flush(self) -> None:
        """Write what is kept."""
        with self.lock:
            self._write()

    def _write(self, final: bool = False) -> None:  # the lock is held
        self.pull()
        buf, store = self.buf, self.store
        # Only what is there now: threads that keep recording must not keep this one writing.
        # The store keeps the text until it is written: a failed write loses nothing.
        store.add_batch([buf.popleft() for _ in range(len(buf))], final)
        if store.text:
            if self.out is None:
                self.open()
            assert self.out is not None
            self.out.write("".join(store.text))
            self.out.flush()
            store.text.clear()
        if self.path is not None:  # after the lines its counts refer to
            store.write_tally(self.path, force=final)

    def stop(self, how: str) -> None:
        """Write what is kept and a ``stop`` record: the process ends here, by ``how``."""
        with self.lock:
            self.pull()
            if self.out is None and not self.buf:
                return
            self._write(final=True)
            self.buf.append({"stop": {"calls": self.call_count(), "how": how}})
            self._write()

    def header(self) -> dict[str, Any]:
        """The header line, taken at the first record (the group may be gone by the time a
        batch is written)."""
        rank = dist.get_rank() if dist.is_initialized() else -1
        world = dist.get_world_size() if dist.is_initialized() else -1
        return {"format": FORMAT, "version": VERSION, "torch": torch.__version__, "rank": rank,
                "world_size": world, "pid": os.getpid(),
                "argv": [a[:ARGV_CHARS] for a in sys.argv[:8]],
                "hook": "native" if self.native is not None else "python" + self.hook_note}

    def open(self) -> None:
        """Open this process's trace file (truncated the first time, appended after)."""
        self.path = Path(self.folder) / f"trace-{os.getpid()}.jsonl"
        self.out = self.path.open("a" if self.opened else "w", encoding="utf-8")
        self.opened = True

    def close(self) -> None:
        """Write the end record and what is left, close the file."""
        with self.lock:
            self.pull()
            if self.out is not None or self.buf:
                self._write(final=True)  # the calls and their final tally, then the end
                self.buf.append({"end": {"calls": self.call_count()}})
                self._write()
            if self.out is not None:
                self.out.close()
                self.out = None

    def after_fork(self) -> None:
        """A forked child writes its own trace: the parent's file and batch are not its; it
        gets its own wakeup pipe (the parent's is shared) and its own flusher thread."""
        self.lock = threading.RLock()
        self.out, self.buf, self.opened, self.started = None, deque(), False, False
        self.path, self.store = None, Store()
        if self.native is not None:
            self.native.restart()
        self.new_works.clear()
        self.works.clear()
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
            try:
                with self.lock:
                    self._write()
                    self.adopt_works()
            except Exception:  # a full disk, say: the batch is kept and tried again next time;
                pass  # close() at exit writes it, and raises there if it still cannot
            if ready:
                got = os.read(self.wake, 64)
                for sig in (getattr(signal, n) for n in SIGNALS):
                    if sig in got:
                        die_by(self, sig)


def die_by(rec: Recorder, sig: int) -> None:
    """Flush, then take the signal's default action (from any thread)."""
    try:
        rec.stop(signal.Signals(sig).name)
    finally:  # a full disk must not keep the process alive past its signal
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
