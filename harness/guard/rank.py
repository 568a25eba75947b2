"""The rank side of the guard: a dispatcher kernel that samples calls, a checker thread.

The kernel is registered for the checked ``c10d::`` ops (:data:`plan.CHECKED`) at the Autograd
keys, as the recorder's Python kernel is (see :mod:`harness.record.hook` for why that key sees
DDP's C++ calls too). An unsampled call costs a counter step and the redispatch. A sampled call
(the N-th per op family and group, the same call on every rank) takes its input digests, is
issued, waited (a sampled async collective is complete when the kernel returns: on CUDA the
wait only makes the current stream wait for the op's), then takes its output digests; a
received p2p buffer is digested when the user waits its Work (waiting it in the kernel could
deadlock a program whose peer sends after its own receive). The digests are queued with a
non-blocking copy to the host; everything else (publishing on the store, reading the peers',
deciding, writing findings) is the checker thread's, off the training thread.

Any failure of the guard itself (the store unreachable, a peer's digests never arriving, a
digest that cannot be taken) prints one line and turns the guard off in this rank: the job goes
on as without it. A finding is appended to this rank's findings file and fsync'ed when it is
decided, so a rank that crashes afterwards leaves it on disk.
"""

from __future__ import annotations

import atexit
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

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from harness.guard import check, digest
from harness.guard.check import Mismatch
from harness.guard.plan import CHECKED, Plan, group_of, plan_for, reduce_name
from harness.guard.settings import Settings, SettingsError, from_env
from harness.record import native
from harness.record.capture import GROUP, REDUCE, call_json, capture_for, where

_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_KEYS = ("AutogradCPU", "AutogradCUDA", "AutogradPrivateUse1")
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
        print(f"collective-guard: rank {rank}: {_line(why)}; checking stopped in this rank, "
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
        print(_line(line), file=sys.stderr, flush=True)
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
        stats = {"rank": rank, "checked": self.checked, "found": self.found, "off": self.off,
                 "calls": calls, "every": self.s.every}
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


def _line(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in " ".join(text.split()))


def _kernel(g: Guard, name: str, op: Any) -> Any:
    """The Python kernel: used only where the C++ one cannot be built (every call enters
    Python here; see the module doc)."""
    redispatch = op._handle.redispatch_boxed
    pg_at, caps = _arguments(op)
    family = CHECKED[name][0]
    p2p = family == "p2p"
    local = g.local

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        below = keyset & _BELOW_AUTOGRAD
        if g.raise_next:
            text, g.raise_next = g.raise_next, ""
            raise GuardMismatch(text)
        if g.off or bool(kwargs) or int(getattr(local, "depth", 0)):
            return redispatch(below, *args, **kwargs)
        pg = group_of(args[pg_at])
        gname = pg.group_name
        key = (name, gname, int(args[2])) if p2p else (family, gname)
        seq = g.sampled(key)
        if seq < 0:
            return redispatch(below, *args)
        return sampled_call(g, name, op, redispatch, below, args, pg, gname, seq, caps)

    return kernel


def _arguments(op: Any) -> tuple[int, list[Any]]:
    schema = op._schema.arguments
    pg_at = next(i for i, a in enumerate(schema) if "ProcessGroup" in str(a.type))
    return pg_at, [(a.name, capture_for(a.name, str(a.type))) for a in schema]


def sampled_call(g: Guard, name: str, op: Any, redispatch: Any, below: Any, args: tuple[Any, ...],
                 pg: Any, gname: str, seq: int, caps: list[Any]) -> Any:
    """Issue a sampled call with its digests around it (the Python kernel's and a Python
    ProcessGroup's path; the C++ kernel calls :func:`prepare` and :func:`complete` itself)."""
    item = prepare(g, name, op, args, pg, gname, seq, caps)
    if item is None:
        return redispatch(below, *args)
    g.local.depth = 1
    try:
        out = redispatch(below, *args)
    finally:
        g.local.depth = 0
    new = complete(g, item, _work(out))
    if new is None:
        return out
    if below is None:  # a Python ProcessGroup's method: it returns the Work alone, unboxed
        return new
    return (out[0], new.boxed()) if type(out) is tuple else new.boxed()


def _work(out: Any) -> Any:
    return out[1] if type(out) is tuple and len(out) == 2 else out


def prepare(g: Guard, name: str, op: Any, args: tuple[Any, ...], pg: Any, gname: str, seq: int,
            caps: list[Any]) -> Item | None:
    """A sampled call's item, its input digests taken (before the op overwrites them); None
    when this form is not checked or the guard cannot digest it (then it turns off)."""
    try:
        group = list(dist.get_process_group_ranks(pg))
        plan = plan_for(name, args, group, g.s.chunk)
        if plan is None:
            return None
        captured = tuple(_capture(n, cap, v, group) for (n, cap), v in zip(caps, args,
                                                                             strict=False))
        site, api = _site(), where()[1]
        call = call_json(str(op._schema.name), captured, api)
    except Exception as exc:
        g.disable(f"cannot digest {name}: {type(exc).__name__}: {exc}")
        return None
    return Item(name, seq, plan, None, call, site, gname, pg.rank())


def complete(g: Guard, item: Item, work: Any) -> Any:
    """After a sampled call was issued: arrange its output digests. A CPU collective whose Work
    has a future is digested in a callback on that future, and the caller gets (boxed) a Work
    completing only after it: the call is not waited here, and nobody sees it complete before
    its output is digested. Otherwise (CUDA: the wait only makes the current stream wait for
    the op's; a Python Work) it is waited here. Returns the replacement Work (unboxed), or
    None."""
    name = item.name
    try:
        pw = work if isinstance(work, c10d.Work) else c10d.Work.unbox(work)
        if name == "recv_":
            _patch_wait(g, type(pw))  # a Python Work overrides wait()
            g.waiting[id(pw)] = (item, pw)
            return None
        if name == "send":
            item.pending = digest.to_host(item.plan.before)
        elif type(pw) is c10d.Work and all(t.device.type == "cpu" for t in item.plan.tensors):
            return _on_completion(g, item, pw)
        else:
            pw.wait()
            item.pending = digest.to_host(item.plan.before + item.plan.after())
    except Exception as exc:
        g.disable(f"cannot digest {name} seq {item.seq}: {type(exc).__name__}: {exc}")
        return None
    g.submit(item)
    return None


def _on_completion(g: Guard, item: Item, pw: Any) -> Any:
    item.landed = threading.Event()

    def landed(fut: Any) -> Any:
        value = fut.value()  # the op's own error, if any, is the caller's as without the guard
        try:
            if not g.off:
                item.pending = digest.to_host(item.plan.before + item.plan.after())
        except Exception as exc:
            g.disable(f"cannot digest {item.name} seq {item.seq}: {type(exc).__name__}: {exc}")
        finally:
            assert item.landed is not None
            item.landed.set()
        return value

    fut = pw.get_future().then(landed)
    g.submit(item)  # in issue order: the checker waits for item.landed
    return c10d._create_work_from_future(fut)  # type: ignore[attr-defined]


_SKIP = (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parents[1]))


def _site() -> str:
    """The user's call site as JSON text: the innermost frame outside torch and the harness."""
    f: Any = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_SKIP) and not name.startswith("<"):
            return json.dumps(f"{name}:{f.f_lineno}")
        f = f.f_back
    return json.dumps("?")


def _capture(name: str, cap: Any, value: Any, group: list[int]) -> Any:
    """An argument as the recorder captures it; the group as its ranks and the reduce op as
    its name, read here (a Python ProcessGroup or a pybind ReduceOp has no boxed form)."""
    if isinstance(value, c10d.ProcessGroup):
        return name, (GROUP, tuple(group))
    if name == "reduce_op":
        return name, (REDUCE, reduce_name(value))
    return name, cap(value)


def _patch_wait(g: Guard, cls: Any = c10d.Work) -> None:
    """Digest a sampled receive when the user's ``wait()`` on its Work returns (once per
    Work class)."""
    if "_collective_guard_wait" in cls.__dict__:
        return
    orig = cls.wait

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        got = orig(self, *args, **kwargs)
        entry = g.waiting.pop(id(self), None) if g.waiting else None
        if entry is not None and not g.off:
            item = entry[0]
            try:
                item.pending = digest.to_host(item.plan.after())
                g.submit(item)
            except Exception as exc:
                g.disable(f"cannot digest recv seq {item.seq}: {type(exc).__name__}: {exc}")
        return got

    setattr(cls, "wait", wait)  # noqa: B010  (a pybind method: mypy forbids =)
    setattr(cls, "_collective_guard_wait", True)  # noqa: B010


_GUARD: list[Guard] = []
_LIBS: list[Any] = []  # the Library objects must stay alive or their kernels are removed


def install(folder: str) -> None:
    """Start guarding this process's collectives (once per process); a bad setting is one line
    and no guard."""
    if _GUARD:
        return
    try:
        settings = from_env()
    except SettingsError as exc:
        print(f"collective-guard: {exc}; the job runs unguarded", file=sys.stderr, flush=True)
        return
    g = Guard(settings, folder)
    _GUARD.append(g)
    wanted = [name for name in CHECKED if name in _wanted(settings)]
    if settings.hook == "native":
        try:
            _attach_native(g, wanted)
        except native.NativeUnavailable as exc:
            print(f"collective-guard: the C++ kernel could not be loaded ({_line(str(exc))}); "
                  "using the Python kernel, which makes every call slower", file=sys.stderr,
                  flush=True)
    if g.native is None:
        lib = torch.library.Library("c10d", "IMPL")  # type: ignore[no-untyped-call]
        _LIBS.append(lib)
        for name in wanted:
            op = getattr(torch.ops.c10d, name).default
            for key in _KEYS:
                lib.impl(name, _kernel(g, name, op), key,  # type: ignore[no-untyped-call]
                         with_keyset=True)
    _patch_destroy(g)
    atexit.register(g.finish)


def _attach_native(g: Guard, names: list[str]) -> None:
    """Count and sample in the C++ kernel; enter Python only for a sampled call."""
    mod = native.load()
    table = {}
    for name in names:
        op = getattr(torch.ops.c10d, name).default
        table[name] = (op, *_arguments(op))

    def before(name: str, seq: int, args: tuple[Any, ...]) -> Item | None:
        try:
            if g.off:
                return None
            op, pg_at, caps = table[name]
            pg = group_of(args[pg_at])
            return prepare(g, name, op, args, pg, pg.group_name, seq, caps)
        except Exception as exc:  # never fail the user's call for the guard's sake
            g.disable(f"cannot digest {name}: {type(exc).__name__}: {exc}")
            return None

    def after(item: Item, outs: tuple[Any, ...]) -> Any:
        try:
            new = complete(g, item, outs[-1])
            return None if new is None else new.boxed()
        except Exception as exc:
            g.disable(f"cannot digest {item.name}: {type(exc).__name__}: {exc}")
            return None

    def raise_next() -> None:
        if g.raise_next:
            text, g.raise_next = g.raise_next, ""
            raise GuardMismatch(text)

    mod.guard_attach(names, [CHECKED[n][0] for n in names], [table[n][1] for n in names],
                     list(_KEYS), g.s.every, before, after, raise_next)
    g.native = mod


def detach() -> None:
    """Unregister the guard's kernel: until :func:`attach`, collectives go through the
    dispatcher as without the guard (ci/bench/bench_guard.py alternates blocks of steps so,
    to compare both in the same processes). Only the C++ kernel can be detached."""
    g = guard()
    if g is not None and g.native is not None:
        g.native.guard_detach()


def attach() -> None:
    """Register the kernel again after :func:`detach`; the counters go on where they were."""
    g = guard()
    if g is not None and g.native is not None:
        g.native.guard_detach()  # never twice: a second registration would override
        g.native.guard_reattach(list(_KEYS))


def _wanted(s: Settings) -> set[str]:
    return {name for name, (family, _) in CHECKED.items() if family in s.families}


def _patch_destroy(g: Guard) -> None:
    mod = dist.distributed_c10d
    orig = mod.destroy_process_group

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:  # the default group: check what is queued first
            g.rank = dist.get_rank() if dist.is_initialized() else -1
            g.finish()
            g.off = True
        return orig(*args, **kwargs)

    mod.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def guard() -> Guard | None:
    """This process's guard (None when not guarding)."""
    return _GUARD[0] if _GUARD else None
