"""Isolated instances run ahead, each on its own pool, while the main pool works (issue 25).

An isolated instance (a declared hang or crash, a program that makes or destroys groups,
``isolate: true``) already runs on a private pool that is closed after it, so nothing it does
can reach another instance; and most of its time is waiting: a rendezvous, a deadline, a
timeout. Run one after the other they serialized the suite behind every deadline. Here a few
threads start them as soon as the run begins, in collection order; when pytest reaches the
item, it takes the finished (or still running) run and judges it exactly as if it had run
then: same resolved instance, same deadline, same diagnosis, same settle. A run ahead that
went wrong in the harness (a pool that would not start is an answer; anything else is not) is
dropped and the item runs the ordinary way.

Must not: run an instance its item would skip, judge a run of any other instance than the one
the item resolved, produce a record by itself (only the item does, once), write to the
terminal from a background thread, or leave a pool running after the session: :meth:`close`
kills whatever is still in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

from ..model import Instance, PoolRun
from ..run.pool import PoolKey, PoolManager, PoolStartError, RankPool

# How often the waiting item looks for a new progress note of its run.
NOTE_POLL_S = 1.0


@dataclass
class Ran:
    """What a run ahead gives back to its item."""

    instance: Instance
    pool: RankPool | None = None
    run: PoolRun | None = None
    pool_s: float = 0.0
    run_s: float = 0.0
    start_error: str = ""  # the pool could not start: the item reports it as usual
    failed: bool = False  # a harness failure: the item runs the ordinary way


class Ahead:
    """Runs isolated instances on background threads; one :class:`Ran` per node id."""

    def __init__(self, manager: PoolManager, workers: int) -> None:
        self.manager = manager
        self.executor = ThreadPoolExecutor(max_workers=workers,
                                           thread_name_prefix="collective-ahead")
        self.futures: dict[str, Future[Ran]] = {}
        self.notes: dict[str, str] = {}
        self.running: set[RankPool] = set()
        self.lock = threading.Lock()
        self.closed = False

    def submit(self, nodeid: str, inst: Instance, key: PoolKey, deadline: float) -> None:
        self.futures[nodeid] = self.executor.submit(self._run, nodeid, inst, key, deadline)

    def _run(self, nodeid: str, inst: Instance, key: PoolKey, deadline: float) -> Ran:
        if self.closed:
            return Ran(inst, failed=True)
        t0 = time.monotonic()
        try:
            pool = self.manager.isolated(key)
        except PoolStartError as exc:
            return Ran(inst, start_error=str(exc), pool_s=time.monotonic() - t0)
        except Exception:
            return Ran(inst, failed=True)
        with self.lock:
            if self.closed:
                pool.kill()
                return Ran(inst, failed=True)
            self.running.add(pool)
        t1 = time.monotonic()

        def note(text: str) -> None:
            self.notes[nodeid] = text

        try:
            run = pool.run(inst, deadline, on_wait=note)
        except Exception:  # pool.run killed the pool before the exception left
            return Ran(inst, failed=True)
        finally:
            with self.lock:
                self.running.discard(pool)
        return Ran(inst, pool, run, pool_s=t1 - t0, run_s=time.monotonic() - t1)

    def take(self, nodeid: str, inst: Instance,
             tell: Callable[[str], None]) -> Ran | None:
        """The run ahead of ``nodeid``, waited for, if it ran ``inst`` and the harness did
        not fail; progress notes of a long run go to ``tell`` from this (pytest's) thread."""
        fut = self.futures.pop(nodeid, None)
        if fut is None:
            return None
        told = ""
        while not fut.done():
            wait_futures([fut], timeout=NOTE_POLL_S)
            text = self.notes.get(nodeid, "")
            if text and text != told:
                tell(text)
                told = text
        self.notes.pop(nodeid, None)
        if fut.cancelled():
            return None
        ran = fut.result()
        if ran.failed or ran.instance != inst:
            if ran.pool is not None:
                ran.pool.kill()
            return None
        return ran

    def close(self) -> None:
        """Cancel what has not started and kill the pools of what has."""
        with self.lock:
            self.closed = True
            pools = list(self.running)
        for fut in self.futures.values():
            if not fut.cancel() and fut.done():
                left = fut.result().pool  # finished, but its item never came
                if left is not None:
                    pools.append(left)
        for pool in pools:
            pool.kill()
        self.executor.shutdown(wait=False, cancel_futures=True)
