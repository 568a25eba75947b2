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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

from ..model import Instance
from ..run.pool import PoolStartError, RankPool
from ..runner.execute import Launched, Runner
from ..runner.prepare import Prepared

# How often the waiting item looks for a new progress note of its run.
NOTE_POLL_S = 1.0


@dataclass
class Ran:
    """What a run ahead gives back to its item."""

    instance: Instance
    launched: Launched | None = None
    start_error: PoolStartError | None = None  # the pool could not start: reported as usual
    failed: bool = False  # a harness failure: the item runs the ordinary way


class Ahead:
    """Runs isolated instances on background threads; one :class:`Ran` per node id."""

    def __init__(self, runner: Runner, workers: int) -> None:
        self.runner = runner
        self.executor = ThreadPoolExecutor(max_workers=workers,
                                           thread_name_prefix="collective-ahead")
        self.futures: dict[str, Future[Ran]] = {}
        self.notes: dict[str, str] = {}
        self.running: set[RankPool] = set()
        self.lock = threading.Lock()
        self.closed = False

    def submit(self, nodeid: str, prepared: Prepared) -> None:
        self.futures[nodeid] = self.executor.submit(self._run, nodeid, prepared)

    def _run(self, nodeid: str, prepared: Prepared) -> Ran:
        inst = prepared.instance
        if self.closed:
            return Ran(inst, failed=True)

        def note(text: str) -> None:
            self.notes[nodeid] = text

        mine: list[RankPool] = []

        def started(pool: RankPool) -> bool:
            with self.lock:
                if self.closed:
                    return False
                self.running.add(pool)
                mine.append(pool)
                return True

        try:
            launched = self.runner.launch(prepared, on_wait=note, started=started)
        except PoolStartError as exc:
            return Ran(inst, start_error=exc)
        except Exception:  # the runner killed the private pool before the exception left
            return Ran(inst, failed=True)
        finally:
            with self.lock:
                self.running.difference_update(mine)
        return Ran(inst, launched)

    def take(self, nodeid: str, inst: Instance,
             tell: Callable[[str], None]) -> Launched | PoolStartError | None:
        """The run ahead of ``nodeid``, waited for, if it ran ``inst`` and the harness did
        not fail (or why its pool did not start); progress notes of a long run go to ``tell``
        from this (pytest's) thread."""
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
            if ran.launched is not None:
                ran.launched.pool.kill()
            return None
        return ran.launched or ran.start_error

    def close(self) -> None:
        """Cancel what has not started and kill the pools of what has."""
        with self.lock:
            self.closed = True
            pools = list(self.running)
        for fut in self.futures.values():
            if not fut.cancel() and fut.done():
                left = fut.result().launched  # finished, but its item never came
                if left is not None:
                    pools.append(left.pool)
        for pool in pools:
            pool.kill()
        self.executor.shutdown(wait=False, cancel_futures=True)
