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

Runs ahead that hold a pool (running, or finished and waiting for their item) are bounded:
a run that finished keeps its pool until its item takes it, and ranks may carry processes of
their own (a backend's worker, a full interpreter with torch: about 230 MB each for torchft's
ProcessGroupBabyGloo), so runs that raced ahead of a slow session without a bound held dozens
of pools and exhausted the machine's memory (21 GiB of 23). A run may start while fewer pools
than threads are held, or while the machine still has :data:`MEMORY_FLOOR` of its memory
available and fewer than :data:`MOST_HELD` are held; otherwise it waits for a slot, in the
order of submission. Bounding by threads alone stalled the quick suite: its isolated
instances (the fault-tolerance matrix, errors, timeouts) wait for their items until late in
the session, so two finished runs took both slots and the rest ran in turn (quick suite idle
13.8 -> 25.9 ms per instance). The run of an item pytest went past without taking it is
dropped (its pool killed), so no slot waits for an item that never comes.

An instance is submitted only when its item would run it, and asked again when its slot
comes: a need that hung twice since (``--after-hang skip``) makes its item a blocked skip, and
its run then never starts a pool. Without that, a run still waiting for its slot when the
breaker tripped started a pool (on torchft's BabyGloo a worker interpreter per rank) and, on a
backend whose subgroups never form, waited out the deadline, for an item that was skipped.
Runs already started when the breaker trips end as before (their items are skipped and the
runs dropped).

Must not: run an instance its item would skip, judge a run of any other instance than the one
the item resolved, produce a record by itself (only the item does, once), write to the
terminal from a background thread, or leave a pool running after the session: :meth:`close`
kills whatever is still in flight.
"""

from __future__ import annotations

import functools
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



# A run ahead beyond one per thread starts only while this share of the machine's memory is
# available (MemAvailable / MemTotal), and while fewer than MOST_HELD pools are held.
MEMORY_FLOOR = 0.25
MOST_HELD = 64
MEMORY_POLL_S = 0.2


def available_memory() -> float:
    """The share of the machine's memory available now (0.0 where it cannot be read: then
    the runs ahead hold one pool per thread)."""
    try:
        with open("/proc/meminfo") as fh:
            info = {k: v for k, v in (ln.split(":", 1) for ln in fh if ":" in ln)}
        total = int(info["MemTotal"].split()[0])
        return int(info["MemAvailable"].split()[0]) / total if total else 0.0
    except (OSError, KeyError, ValueError):
        return 0.0


class Ahead:
    """Runs isolated instances on background threads; one :class:`Ran` per node id."""

    def __init__(self, runner: Runner, workers: int,
                 memory_floor: float | None = None) -> None:
        self.runner = runner
        self.executor = ThreadPoolExecutor(max_workers=workers,
                                           thread_name_prefix="collective-ahead")
        self.futures: dict[str, Future[Ran]] = {}
        self.notes: dict[str, str] = {}
        self.running: set[RankPool] = set()
        self.lock = threading.Lock()
        self.closed = False
        # One slot per run that holds a pool (running, or finished and not taken yet), given
        # in the order of submission (the order pytest will want them in).
        self.cond = threading.Condition(self.lock)
        self.workers = max(1, workers)
        self.memory_floor = memory_floor
        self.queue: list[str] = []  # node ids waiting for a slot, in submission order
        self.holding: set[str] = set()  # node ids whose run holds a slot
        # Items pytest went past without taking their run (it takes them in submission order):
        # their runs are dropped, so that a slot is never held for an item that never comes.
        self.order: list[str] = []
        self.passed: set[str] = set()

    def submit(self, nodeid: str, prepared: Prepared) -> None:
        with self.cond:
            self.queue.append(nodeid)
            self.order.append(nodeid)
        self.futures[nodeid] = self.executor.submit(self._run, nodeid, prepared)

    def _run(self, nodeid: str, prepared: Prepared) -> Ran:
        if not self._acquire(nodeid):
            return Ran(prepared.instance, failed=True)  # its item runs the ordinary way
        if self.runner.hung_need(prepared.instance):
            # What it needs hung twice since it was submitted (--after-hang skip); the
            # breaker never resets, so its item is skipped as blocked: a pool started now
            # (a worker interpreter per rank on some backends) and a run to the deadline
            # would be for nothing. Its item prepares again and records the skip.
            self._release(nodeid)
            return Ran(prepared.instance, failed=True)
        ran = self._launch(nodeid, prepared)
        if ran.launched is None:  # no pool is left running
            self._release(nodeid)
        return ran

    def _acquire(self, nodeid: str) -> bool:
        """Wait for ``nodeid``'s slot; False when the session closes or pytest went past its
        item. Never waits for an item that will not come: a slot is held by a run of an item
        before this one, which pytest takes or goes past (then the run is dropped as soon as
        it ends, within its deadline)."""
        with self.cond:
            while True:
                if self.closed or nodeid in self.passed:
                    if nodeid in self.queue:
                        self.queue.remove(nodeid)
                    self.cond.notify_all()
                    return False
                if self.queue[0] == nodeid and self._room():
                    self.queue.pop(0)
                    self.holding.add(nodeid)
                    self.cond.notify_all()
                    return True
                # Memory frees without a notification (another process's): look again soon.
                self.cond.wait(MEMORY_POLL_S)

    def _room(self) -> bool:
        """Whether one more run may hold a pool (called with the lock held)."""
        held = len(self.holding)
        if held < self.workers:
            return True
        floor = MEMORY_FLOOR if self.memory_floor is None else self.memory_floor
        return held < MOST_HELD and available_memory() >= floor

    def _release(self, nodeid: str) -> None:
        with self.cond:
            if nodeid in self.holding:
                self.holding.discard(nodeid)
                self.cond.notify_all()

    def _launch(self, nodeid: str, prepared: Prepared) -> Ran:
        inst = prepared.instance

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
        self._pass_before(nodeid)
        fut = self.futures.pop(nodeid, None)
        if fut is None:
            return None
        try:
            return self._take(nodeid, fut, inst, tell)
        finally:
            self._release(nodeid)  # the pool is the item's now, or killed

    def _take(self, nodeid: str, fut: Future[Ran], inst: Instance,
              tell: Callable[[str], None]) -> Launched | PoolStartError | None:
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

    def _pass_before(self, nodeid: str) -> None:
        """Drop the runs of the items submitted before ``nodeid`` that were never taken
        (their item failed in the harness, or pytest stopped it): kill a finished one's
        pool and free its slot (one still running: when it ends); one still waiting for a
        slot gives up."""
        with self.cond:
            if nodeid not in self.order:
                return
            before = self.order[:self.order.index(nodeid)]
            del self.order[:len(before) + 1]
            left = [n for n in before if n in self.futures]
            self.passed.update(left)
            # A run not started yet is cancelled below: it must not keep its turn.
            self.queue = [q for q in self.queue if q not in self.passed]
            self.cond.notify_all()
        for n in left:
            fut = self.futures.pop(n)
            if not fut.cancel():  # started: dropped now if it ended, else when it does
                fut.add_done_callback(functools.partial(self._drop, n))

    def _drop(self, nodeid: str, fut: Future[Ran]) -> None:
        ran = fut.result()
        if ran.launched is not None:
            ran.launched.pool.kill()
        self._release(nodeid)

    def close(self) -> None:
        """Cancel what has not started and kill the pools of what has."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            pools = list(self.running)
        for fut in self.futures.values():
            if not fut.cancel() and fut.done():
                left = fut.result().launched  # finished, but its item never came
                if left is not None:
                    pools.append(left.pool)
        for pool in pools:
            pool.kill()
        self.executor.shutdown(wait=False, cancel_futures=True)
