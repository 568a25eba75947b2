"""Lanes: copies of the executor, each with its own rank pools, that run the instances of one
generated batch at the same time (``collective-fuzz --lanes N``).

Most of an instance's wall time on a small machine is deliberate waiting that uses no CPU:
the ordering probes' delayed rank and settle polls, a slow sender's sleep, the wait before a
stranded rank is declared blocked. One pool waits through all of it in turn; with lanes, an
example is a batch of instances (Hypothesis draws the list, and shrinks it like any other
value, down to the one that fails), and each lane runs whole documents on pools of its own,
so one lane's waiting overlaps another's work. Every document still runs exactly as
:meth:`Executor.run_text` runs it, on one lane, and is judged there; results come back in the
batch's order. Lanes share nothing but the known library, whose counters are locked.
"""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

from .execute import Executor, Ran


class Lanes:
    """``executors[0]`` and its copies; :meth:`run` runs a batch across them."""

    def __init__(self, executors: list[Executor]) -> None:
        if not executors:
            raise ValueError("lanes need at least one executor")
        self.executors = executors
        self._free: queue.Queue[Executor] = queue.Queue()
        for ex in executors:
            self._free.put(ex)
        self._threads = (ThreadPoolExecutor(len(executors), thread_name_prefix="fuzz-lane")
                         if len(executors) > 1 else None)

    @property
    def width(self) -> int:
        """How many documents run at the same time at most."""
        return len(self.executors)

    def _one(self, text: str) -> Ran:
        ex = self._free.get()  # never blocks: no more tasks run than there are lanes
        try:
            return ex.run_text(text)
        finally:
            self._free.put(ex)

    def run(self, texts: list[str]) -> list[Ran]:
        """Run and judge every document of ``texts``, in parallel across the lanes; the
        verdicts in the same order."""
        if self._threads is None or len(texts) <= 1:
            return [self.executors[0].run_text(t) for t in texts]
        return list(self._threads.map(self._one, texts))

    def close(self) -> None:
        """Stop every lane's pools (no rank process outlives this)."""
        if self._threads is not None:  # after Ctrl-C: nothing new starts ...
            self._threads.shutdown(wait=False, cancel_futures=True)
        for ex in self.executors:  # ... and a document still running ends with its pool
            ex.close()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
