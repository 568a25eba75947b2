"""The guard's state in one rank and its checker thread (the training thread's side is
:mod:`harness.guard.rank`).

:class:`Guard` holds the settings, the Python path's counters and queue of sampled calls, and
the findings file. The checker thread takes the calls whose digests exist, in batches (the C++
kernel's records after a short linger, the Python path's items as they land), publishes them
in one message per peer (:mod:`harness.guard.channel`), reads what the peers published,
decides each call whose digests are all there (:mod:`harness.guard.check`) and writes a
finding at once, appended and fsync'ed. While calls wait for peers it polls its inbox (every
few milliseconds, backing off); otherwise it sleeps until the kernel hands it something. A
failure of the side channel, or peers' digests not arriving within the timeout, turns the
guard off in this rank with one line.

Finishing (at exit, at ``destroy_process_group``): the kernel hands over what it holds without
lingering, the checker decides everything outstanding (bounded by the timeout) and stops, then
the ranks meet on the store so that the one holding it does not leave while the others read.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from harness.guard import channel, check
from harness.guard.calls import Entry, Item, from_item, from_native
from harness.guard.check import Mismatch
from harness.guard.settings import Settings

LINGER_S = 0.05  # how long the checker lets calls gather before publishing them
BATCH = 128  # or until this many are ready
IDLE_S = 1.0  # its longest sleep with nothing outstanding
POLL_S = (0.002, 0.05)  # its inbox polls while calls wait for peers: first, longest
# The longest it decides without letting go of the GIL: a call decided on its bytes takes
# microseconds, and a yield per call (a system call) cost as much as deciding it.
YIELD_S = 2e-4


class GuardMismatch(RuntimeError):
    """Raised in the training thread under ``--on-mismatch raise``."""


class GuardFailure(RuntimeError):
    """The guard's own failure away from the side channel (a digest the kernel could not
    take, a checker that fell behind): the message says it."""


class Guard:
    """One process's guard: counters, the queue, the checker thread, the findings file."""

    def __init__(self, settings: Settings, folder: str) -> None:
        self.s = settings
        self.folder = folder
        self._off = False
        self.native: Any = None  # the C++ kernel's module, when it counts and samples
        self.local: Any = threading.local()
        self.counters: dict[tuple[Any, ...], int] = {}
        self.ordinal = 0  # the Python kernel's count of checked-kind calls
        self.steps = 0  # optimizer steps, where the C++ kernel does not count them
        self.items: collections.deque[Item] = collections.deque()
        self.wake_event = threading.Event()
        self.store: Any = None
        self.exchange: channel.Exchange | None = None
        self.waiting: dict[int, tuple[Item, Any]] = {}  # id(recv Work) -> its item, the Work
        self.raise_next: str = ""
        self.checked = 0
        self.on_bytes = 0  # of them, decided on the digests' bytes (check.honest)
        self.found = 0
        self.loops = 0  # the checker's, and its thread's CPU time when it stopped (stats)
        self.cpu_s = 0.0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.finished = False
        self.rank = -1

    @property
    def off(self) -> bool:
        """Whether this rank stopped checking (the C++ kernel is told too)."""
        return self._off

    @off.setter
    def off(self, value: bool) -> None:
        self._off = value
        if value and self.native is not None:
            self.native.guard_off()

    def calls(self) -> int:
        """How many checked-kind calls this rank made (sampled or not)."""
        return sum(self.counters.values()) + (0 if self.native is None
                                              else int(self.native.guard_calls()))

    def step(self) -> int:
        """Optimizer steps taken so far in this process."""
        return self.steps if self.native is None else int(self.native.guard_steps())

    # -- the training thread ---------------------------------------------------------------
    def sampled(self, key: tuple[Any, ...]) -> int:
        """This call's number in its counter, or -1 when it is not sampled."""
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        self.ordinal += 1
        return n if n % self.s.every == 0 else -1

    def disable(self, why: str) -> None:
        """Turn the guard off in this rank with one line; the job goes on unguarded."""
        if self.off:
            return
        self.off = True
        rank = dist.get_rank() if dist.is_initialized() else -1
        print(f"collective-guard: rank {rank}: {one_line(why)}; checking stopped in this rank, "
              "the job goes on unguarded", file=sys.stderr, flush=True)

    def start(self) -> None:
        """Start the checker (once)."""
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self.checker, name="collective-guard",
                                               daemon=True)
                self.thread.start()

    def submit(self, item: Item) -> None:
        """Queue a Python-path call (in issue order); the checker takes it once it landed."""
        self.start()
        self.items.append(item)
        self.wake()

    def wake(self, flush: bool = False) -> None:
        """Have the checker look now (``flush``: and hand over calls without lingering)."""
        if self.native is not None:
            self.native.guard_wake(flush)
        self.wake_event.set()

    # -- the checker thread ----------------------------------------------------------------
    def checker(self) -> None:
        """Take, publish, read, decide, write; until finished or off."""
        outstanding: list[Entry] = []
        poll = POLL_S[0]
        try:
            self.loop(outstanding, poll)
        finally:
            self.cpu_s = time.thread_time()

    def loop(self, outstanding: list[Entry], poll: float) -> None:
        """The checker's loop (see :meth:`checker`)."""
        while not self.off:
            self.loops += 1
            try:
                wait = poll if outstanding else IDLE_S
                entries = self.take(0.0 if self.stopping else wait)
                if self.exchange is None and (entries or outstanding):
                    self.store = self.store or channel.open_store(self.s.timeout_s)
                    self.exchange = channel.Exchange(channel.Inbox(self.store, dist.get_rank()))
                if entries:
                    assert self.exchange is not None
                    self.exchange.publish(entries)
                    now = time.monotonic()
                    for e in entries:
                        e.since = now
                    outstanding += [e for e in entries if e.needs()]
                if outstanding:
                    assert self.exchange is not None
                    got = self.exchange.collect()
                    outstanding = self.decide_ready(outstanding)
                    poll = POLL_S[0] if got or entries else min(poll * 2, POLL_S[1])
                if self.stopping and not outstanding and self.idle():
                    return
                if self.stopping:
                    time.sleep(poll)
            except GuardFailure as exc:
                self.disable(str(exc))
            except Exception as exc:
                self.disable(f"the side channel failed: {type(exc).__name__}: {exc}")

    def take(self, wait_s: float) -> list[Entry]:
        """The calls whose digests exist (waiting up to ``wait_s`` for one)."""
        out: list[Entry] = []
        if self.items:  # a CUDA item lands without a callback: looked at again soon
            wait_s = 0.0 if self.items[0].ready() else min(wait_s, POLL_S[1])
        if self.native is not None:
            recs = self.native.guard_take(wait_s, LINGER_S, BATCH)
            why = self.native.guard_failure()
            if why:
                raise GuardFailure(why)
            out += [from_native(self.native, r) for r in recs]
        elif wait_s > 0:
            self.wake_event.wait(wait_s)
        self.wake_event.clear()
        while self.items and self.items[0].ready():
            item = self.items.popleft()
            if item.pending is None and item.landed is not None:
                continue  # not digested (the guard turned off meanwhile, or the op failed)
            if item.pending is not None:
                item.pending.wait()
            out.append(from_item(item))
        return out

    def idle(self) -> bool:
        """Whether nothing is on its way to the checker."""
        pending = 0 if self.native is None else int(self.native.guard_pending())
        return pending == 0 and not self.items

    def decide_ready(self, outstanding: list[Entry]) -> list[Entry]:
        """Decide the calls whose peers' digests all arrived; the rest, if not too old."""
        assert self.exchange is not None
        left = []
        now = time.monotonic()
        held = time.perf_counter()
        for e in outstanding:
            if self.exchange.ready(e):
                self.decide(e, self.exchange.digests(e, raw_only=True))
                if time.perf_counter() - held > YIELD_S:
                    time.sleep(0)  # lets a training thread waiting for the GIL have it now
                    held = time.perf_counter()
            elif now - e.since > self.s.timeout_s:
                raise TimeoutError(f"rank(s) {self.exchange.missing(e)} did not publish their "
                                   f"digests of {e.family} seq {e.seq} within "
                                   f"{self.s.timeout_s:g} s")
            else:
                left.append(e)
        return left

    def decide(self, e: Entry, raw_digs: list[dict[str, Any]]) -> None:
        """The verdict on one call from every rank's raw digests; a finding if this rank's data
        is wrong. An honest call is passed on its bytes (:func:`check.honest`, most of them);
        the numbers are read only for the others."""
        if check.honest(e.spec, raw_digs, None if self.native is None
                        else self.native.guard_sum_ok):
            self.checked += 1
            self.on_bytes += 1
            return
        digs = [channel.as_rows(d) for d in raw_digs]
        if e.family == "p2p":
            verdict = check.check_p2p(e.spec, digs[0], digs[1])
            own = verdict.mismatches
        else:
            verdict = check.decide(e.spec, digs)
            own = [m for m in verdict.mismatches if m.rank == e.rank]
        self.checked += 1
        if verdict.mismatches and e.family != "p2p":
            self.keep_inputs(e)  # every rank of the call: the case needs all of them
        if own:
            self.report(e, own, digs)

    def keep_inputs(self, e: Entry) -> None:
        """This rank's input of a call found wrong, for the finding's case (--keep-inputs)."""
        kept = e.kept()
        if not kept:
            return
        values = [v for t in kept for v in t.reshape(-1).tolist()]
        record = {"inputs": {"group_name": e.gname, "op": e.family, "seq": e.seq,
                             "rank": e.rank, "dtype": str(kept[0].dtype).removeprefix("torch."),
                             "values": values}}
        self.append(f"inputs-{os.getpid()}.jsonl", record)

    def append(self, name: str, record: dict[str, Any]) -> None:
        """Append one JSON line to a file of this rank's, fsync'ed (it survives a crash)."""
        path = Path(self.folder) / name
        with self.lock, path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def report(self, e: Entry, found: list[Mismatch], digs: list[Any]) -> None:
        """Write the finding (appended, fsync'ed), then say it and act as asked."""
        call, site = e.describe()
        self.append(f"findings-{os.getpid()}.jsonl", {"finding": {
            "op": e.family, "dispatcher_op": e.name, "group": e.spec["group"],
            "group_name": e.gname, "seq": e.seq, "site": site, "rank": e.rank, "call": call,
            "step": e.step, "ordinal": e.ordinal,
            "world": dist.get_world_size() if dist.is_initialized() else None,
            "spec": e.spec, "digests": digs, "pid": os.getpid(),
            "mismatches": [m.__dict__ for m in found]}})
        self.found += 1
        m = found[0]
        where_ = f"chunk {m.chunk}" + (f", element {m.first}" if m.first is not None else "")
        sender = f" from rank {m.sender}" if m.sender is not None else ""
        line = (f"collective-guard: MISMATCH {e.family} seq {e.seq} on group {e.spec['group']} "
                f"at {site} (step {e.step}, call {e.ordinal} of this rank): rank {m.rank} "
                f"{where_}{sender}: {m.what}"
                + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""))
        print(one_line(line), file=sys.stderr, flush=True)
        if self.s.on_mismatch == "abort":
            os.abort()
        if self.s.on_mismatch == "raise":
            self.raise_next = line
            if self.native is not None:
                self.native.guard_raise()  # the C++ kernel's next call asks raise_next

    def finish(self) -> None:
        """Drain (once), then write this rank's stats: what it checked, whether it stopped."""
        if self.finished:
            return
        self.finished = True
        self.drain()
        calls = self.calls()
        if not calls:
            return  # a process that made no checked call (a launcher): nothing to say
        rank = dist.get_rank() if dist.is_initialized() else self.rank
        stats: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "checked": self.checked,
                                 "found": self.found, "on_bytes": self.on_bytes,
                 "off": self.off, "calls": calls, "every": self.s.every}
        if self.exchange is not None:
            stats |= {"pushes": self.exchange.pushes, "pops": self.exchange.pops,
                      "loops": self.loops, "checker_cpu_s": round(self.cpu_s, 4)}
        if self.native is not None:
            stats["digest_s"] = round(float(self.native.guard_digest_s()), 4)
        with contextlib.suppress(OSError):  # the findings are written; stats only summarise
            (Path(self.folder) / f"stats-{os.getpid()}.json").write_text(json.dumps(stats))

    def drain(self) -> None:
        """Decide what is outstanding (bounded by the timeout), then meet the other ranks on the
        store so that the one holding it does not leave while the others still read."""
        if self.thread is None or self.off:
            return
        self.stopping = True
        self.wake(flush=True)
        self.thread.join(self.s.timeout_s)
        if self.thread.is_alive():
            self.disable(f"the checks outstanding at exit did not finish within "
                         f"{self.s.timeout_s:g} s")
        if self.off or not dist.is_initialized() or self.exchange is None:
            return  # (no exchange: this rank published nothing, so no one reads from it)
        try:
            store, world, me = self.store, dist.get_world_size(), dist.get_rank()
            store.set(f"done/{me}", "1")
            store.wait([f"done/{r}" for r in range(world)], timedelta(seconds=self.s.timeout_s))
        except Exception as exc:
            self.disable(f"the other ranks did not finish checking: {type(exc).__name__}: {exc}")


def one_line(text: str) -> str:
    """``text`` on one line, control characters escaped (for a person at a terminal)."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in " ".join(text.split()))
