"""Processes forked from the pools' forkserver whose exit status any thread may read.

A forkserver child is not the harness's child: the forkserver reaps it and writes its exit
status once, as eight bytes on a pipe, then closes the pipe. multiprocessing reads that pipe
without a lock: two threads that both see it readable both read, one gets the status and the
other the pipe's end, for which multiprocessing records 255 (its guess that the forkserver
died). A run has such threads: run-ahead threads start pools while the main thread diagnoses
a rank that died, and starting any process polls every live child. A rank's ``os._exit(7)``
was reported as exit code 255. Here every read of the status goes through one lock, after
any blocking wait, so the second reader finds the status the first one read.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import threading
from multiprocessing import context, popen_forkserver
from multiprocessing.process import BaseProcess

# One lock for every child: reads are short (the status is on the pipe when it is readable),
# and multiprocessing polls all children from whichever thread starts a process. Reentrant: a
# signal handler that ends pools may run in a thread that holds it.
_STATUS_LOCK = threading.RLock()


class _StatusPopen(popen_forkserver.Popen):
    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is None and flag != os.WNOHANG:
            multiprocessing.connection.wait([self.sentinel])  # outside the lock: may block
        with _STATUS_LOCK:
            return super().poll(os.WNOHANG)


class ForkserverProcess(context.ForkServerProcess):
    """A forkserver process whose ``exitcode``, ``is_alive()`` and ``join()`` are safe to
    call from several threads at once."""

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> popen_forkserver.Popen:
        return _StatusPopen(process_obj)


class ForkserverContext(context.ForkServerContext):
    """multiprocessing's forkserver context, making :class:`ForkserverProcess` processes."""

    Process = ForkserverProcess
