"""The guard's state in one rank and its checker thread (the training thread's side is
:mod:`harness.guard.rank`).

:class:`Guard` holds the settings, the counters of the Python kernels, the queue of sampled
calls in issue order and the findings file. The checker thread takes one queued call at a time:
it waits until the call's digests exist (a completion callback may still be taking them),
publishes this rank's digests on the job's own c10d store (JSON, never pickle), reads the other
ranks', decides (:mod:`harness.guard.check`) and writes a finding at once, appended and
fsync'ed. A failure of the side channel turns the guard off in this rank with one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from harness.guard import check, digest
from harness.guard.check import Mismatch
from harness.guard.plan import CHECKED, Plan
from harness.guard.settings import Settings

PREFIX = "collective-guard/"


class GuardMismatch(RuntimeError):
    """Raised in the training thread under ``--on-mismatch raise``."""


@dataclass
class Item:
    """A sampled call on its way to the checker."""

    name: str
    seq: int
    plan: Plan
    pending: digest.Pending | None
    call: str  # the call's JSON (the recorder's format), for the finding's case
    site: str
    gname: str
    me: int  # this rank's position in the group
    landed: threading.Event | None = None  # set once a completion callback took the digests


class Guard:
    """One process's guard: counters, the queue, the checker thread, the findings file."""

    def __init__(self, settings: Settings, folder: str) -> None:
        self.s = settings
        self.folder = folder
        self._off = False
        self.native: Any = None  # the C++ kernel's module, when it counts and samples
        self.local: Any = threading.local()
        self.counters: dict[tuple[Any, ...], int] = {}
        self.queue: queue.Queue[Item | None] = queue.Queue()
        self.store: Any = None
        self.waiting: dict[int, tuple[Item, Any]] = {}  # id(recv Work) -> its item, the Work
        self.raise_next: str = ""
        self.checked = 0
        self.found = 0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
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

    # -- the training thread ---------------------------------------------------------------
    def sampled(self, key: tuple[Any, ...]) -> int:
        """This call's number in its counter, or -1 when it is not sampled."""
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        return n if n % self.s.every == 0 else -1

    def disable(self, why: str) -> None:
        """Turn the guard off in this rank with one line; the job goes on unguarded."""
        if self.off:
            return
        self.off = True
        rank = dist.get_rank() if dist.is_initialized() else -1
        print(f"collective-guard: rank {rank}: {one_line(why)}; checking stopped in this rank, "
              "the job goes on unguarded", file=sys.stderr, flush=True)

    def submit(self, item: Item) -> None:
        """Queue a sampled call; start the checker at the first."""
        if self.thread is None:
            self.thread = threading.Thread(target=self.checker, name="collective-guard",
                                           daemon=True)
            self.thread.start()
        self.queue.put(item)

    # -- the checker thread ----------------------------------------------------------------
    def channel(self) -> Any:
        """The side channel: the job's own c10d store, under a prefix of ours."""
        if self.store is None:
            base = dist.distributed_c10d._get_default_store()
            self.store = c10d.PrefixStore(PREFIX, base)
            self.store.set_timeout(timedelta(seconds=self.s.timeout_s))
        return self.store

    def checker(self) -> None:
        """Publish, read, decide, write: one sampled call at a time, until told to stop."""
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if not self.off:
                    self.check(item)
            except Exception as exc:
                self.disable(f"the side channel failed at {item.name if item else '?'} "
                             f"(seq {item.seq if item else '?'}): {type(exc).__name__}: {exc}")
            finally:
                self.queue.task_done()

    def check(self, item: Item) -> None:
        """Decide one sampled call from every rank's digests."""
        rows: list[Any] = []
        if item.landed is not None and not item.landed.wait(self.s.timeout_s):
            raise TimeoutError(f"the call did not complete within {self.s.timeout_s} s")
        if item.pending is None and item.landed is not None:
            return  # not digested (the guard turned off meanwhile)
        if item.pending is not None:
            item.pending.wait()
            rows = digest.as_lists(item.pending)
        spec = item.plan.spec
        nin = len(item.plan.before)
        mine = {"rank": spec["group"][item.me], "in": rows[:nin], "out": rows[nin:]}
        store = self.channel()
        if spec["kind"] == "p2p":
            self.check_p2p(item, mine, store)
            return
        base = f"{item.gname}/{CHECKED[item.name][0]}/{item.seq}"
        store.set(f"{base}/{item.me}", json.dumps(mine))
        keys = [f"{base}/{p}" for p in range(len(spec["group"]))]
        store.wait(keys)
        digs = [mine if p == item.me else json.loads(store.get(k)) for p, k in enumerate(keys)]
        if store.add(f"{base}/read", 1) == len(keys):  # the last reader tidies up
            for k in [*keys, f"{base}/read"]:
                store.delete_key(k)
        verdict = check.decide(spec, digs)
        self.checked += 1
        own = [m for m in verdict.mismatches if m.rank == mine["rank"]]
        if own:
            self.report(item, own, digs)

    def check_p2p(self, item: Item, mine: dict[str, Any], store: Any) -> None:
        spec = item.plan.spec
        me, peer = spec["group"][item.me], spec["group"][spec["peer"]]
        if item.name == "send":
            store.set(f"{item.gname}/p2p/{me}-{peer}/{spec['tag']}/{item.seq}", json.dumps(mine))
            return
        key = f"{item.gname}/p2p/{peer}-{me}/{spec['tag']}/{item.seq}"
        store.wait([key])
        sent = json.loads(store.get(key))
        store.delete_key(key)
        verdict = check.check_p2p(spec, sent, mine)
        self.checked += 1
        if verdict.mismatches:
            self.report(item, verdict.mismatches, [sent, mine])

    def report(self, item: Item, found: list[Mismatch], digs: list[Any]) -> None:
        """Write the finding (appended, fsync'ed), then say it and act as asked."""
        spec = item.plan.spec
        record = {"finding": {
            "op": CHECKED[item.name][0], "dispatcher_op": item.name, "group": spec["group"],
            "group_name": item.gname, "seq": item.seq, "site": json.loads(item.site),
            "rank": spec["group"][item.me], "call": json.loads(item.call + "}"),
            "world": dist.get_world_size() if dist.is_initialized() else None,
            "spec": spec, "digests": digs, "pid": os.getpid(),
            "mismatches": [m.__dict__ for m in found]}}
        path = Path(self.folder) / f"findings-{os.getpid()}.jsonl"
        with self.lock, path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.found += 1
        m = found[0]
        where_ = f"chunk {m.chunk}" + (f", element {m.first}" if m.first is not None else "")
        sender = f" from rank {m.sender}" if m.sender is not None else ""
        line = (f"collective-guard: MISMATCH {CHECKED[item.name][0]} seq {item.seq} on group "
                f"{spec['group']} at {json.loads(item.site)}: rank {m.rank} {where_}{sender}: "
                f"{m.what}" + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""))
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
        stats = {"rank": rank, "pid": os.getpid(), "checked": self.checked, "found": self.found,
                 "off": self.off, "calls": calls, "every": self.s.every}
        with contextlib.suppress(OSError):  # the findings are written; stats only summarise
            (Path(self.folder) / f"stats-{os.getpid()}.json").write_text(json.dumps(stats))

    def drain(self) -> None:
        """Check what is queued (bounded by the timeout), then meet the other ranks on the store
        so that the one holding it does not leave while the others still read."""
        if self.thread is None or self.off:
            return
        deadline = time.monotonic() + self.s.timeout_s
        while self.queue.unfinished_tasks and time.monotonic() < deadline and not self.off:
            time.sleep(0.01)
        if self.off or not dist.is_initialized():
            return
        try:
            store, world, me = self.channel(), dist.get_world_size(), dist.get_rank()
            store.set(f"done/{me}", "1")
            store.wait([f"done/{r}" for r in range(world)])
        except Exception as exc:
            self.disable(f"the other ranks did not finish checking: {type(exc).__name__}: {exc}")


def one_line(text: str) -> str:
    """``text`` on one line, control characters escaped (for a person at a terminal)."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in " ".join(text.split()))
