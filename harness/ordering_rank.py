"""Rank side of the async-contract checks: ordering steps, stream facts and delayed probes.

Runs inside rank processes (imports torch). "The current stream" is a CUDA stream for CUDA
tensors; for CPU tensors the host is the stream, so stream work is host work there: a delay
is a host sleep and a read is a host copy. Verdicts are computed in the parent
(:mod:`harness.ordering`) from the observations returned here.

A probe is an extra run of a shorthand async instance on fresh buffers:

- ``post_wait``: one rank (the plan's delayed rank) starts slow work only once every other
  member has signalled, through the rendezvous store, that it is at the call; the others call,
  query ``is_completed()`` (and snapshot the output if it says true), ``wait()``, snapshot the
  output at once (a copy on the current stream, no host synchronize), then settle (device
  synchronize, or poll ``is_completed()`` on CPU) and read again: the settled read is the
  baseline that tells ordering faults from plain wrong values;
- ``pre_op``: each rank runs the op once on an input holding old values (so a backend that
  stages or caches its inputs has seen them), then a slow producer (sleep kernel, or host
  sleep) writes the real input, the op runs again and its settled result is checked;
- ``host_blocking``: the blocking form with the delayed rank, timed on the other ranks, and
  its output read right after it returns.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from . import tensors
from .model import Instance, Step, StepEvent, TensorCheck

STEP_KINDS = frozenset({"delay_stream", "write", "read", "future"})
# Settling on CPU polls is_completed() for at most this many delays (and this minimum): long
# enough for a result that lands after the delayed peer, short enough that a Work which never
# reports completion (Gloo's reduce_scatter) costs little.
SETTLE_DELAYS = 5.0
SETTLE_MIN_S = 0.25
ALIGN_S = 10.0  # longest wait of the delayed rank for the others to reach the call
POLL_S = 0.0005
CALIBRATION_CYCLES = 2_000_000
_cycles_per_s: float | None = None


def wrong_text(c: TensorCheck) -> str:
    """One line saying how a comparison failed."""
    first = ", ".join(f"[{i}] expected {e} got {g}" for i, e, g in c.first_wrong[:3])
    text = f"{c.wrong} of {c.total} element(s) wrong" + (f" ({c.note})" if c.note else "")
    return text + (f"; first: {first}" if first else "")


def _sleep_cycles_per_s() -> float:
    """Clock cycles of ``torch.cuda._sleep`` per second, measured once per rank with events."""
    global _cycles_per_s
    if _cycles_per_s is None:
        torch.cuda._sleep(CALIBRATION_CYCLES // 10)  # type: ignore[no-untyped-call]
        rates: list[float] = []
        for _ in range(3):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            torch.cuda._sleep(CALIBRATION_CYCLES)  # type: ignore[no-untyped-call]
            end.record()
            end.synchronize()
            rates.append(CALIBRATION_CYCLES / max(start.elapsed_time(end), 1e-3) * 1000.0)
        _cycles_per_s = sorted(rates)[1]
    return _cycles_per_s


class Device:
    """What "slow work on the current stream", "synchronize" and "settle" mean here."""

    def __init__(self, kind: str, settle_s: float = SETTLE_MIN_S) -> None:
        self.cuda = kind == "cuda"
        self.settle_s = settle_s

    def delay(self, seconds: float) -> None:
        """Slow work on the current stream: a sleep kernel (CUDA) or a host sleep (CPU)."""
        if seconds <= 0:
            return
        if self.cuda:
            torch.cuda._sleep(int(seconds * _sleep_cycles_per_s()))  # type: ignore[no-untyped-call]
        else:
            time.sleep(seconds)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def settle(self, work: Any) -> None:
        """Make sure ``work`` finished, without trusting ``wait()`` (for settled reads)."""
        if self.cuda:
            torch.cuda.synchronize()
            return
        end = time.monotonic() + self.settle_s
        while not work.is_completed() and time.monotonic() < end:
            time.sleep(POLL_S)

    def facts(self, stream: str) -> tuple[str | None, str | None]:
        """(device, stream) of the current CUDA context, for the timeline."""
        if not self.cuda:
            return None, None
        cur = torch.cuda.current_stream()
        return f"cuda:{torch.cuda.current_device()}", f"{stream}:{cur.stream_id}"


class ProgramState:
    """What the ordering steps need while a program runs on this rank, and what they saw."""

    def __init__(self, inst: Instance, rank: int, world_size: int, device: str, t0: float,
                 env: dict[str, Any], bufs: dict[str, torch.Tensor],
                 before: dict[str, torch.Tensor], touched: set[str]) -> None:
        self.inst, self.rank, self.world_size, self.env = inst, rank, world_size, env
        self.dev = Device(device)
        self.t0 = t0
        self.bufs, self.before, self.touched = bufs, before, touched
        self.works: dict[str, Any] = {}  # every async work by handle, waited or not
        self.waited: list[tuple[Any, StepEvent]] = []
        self.snaps: list[tuple[Step, int, torch.Tensor]] = []
        self.futures: list[dict[str, Any]] = []
        self._side: Any = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    @contextlib.contextmanager
    def stream(self, step: Step) -> Iterator[None]:
        """Issue ``step`` on the side stream if it asks for one (after the current stream)."""
        if step.stream != "side":
            yield
            return
        if self._side is None:
            self._side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        self._side.wait_stream(torch.cuda.current_stream())  # as a user must, for the input
        with torch.cuda.stream(self._side):
            yield

    def issued(self, step: Step, work: Any, ev: StepEvent) -> None:
        """Record the device/stream facts of an op call (inside its stream context)."""
        ev.device, ev.stream = self.dev.facts(step.stream)
        if work is not None and step.handle:
            self.works[step.handle] = work

    def wait(self, work: Any, ev: StepEvent, thread: bool = False) -> None:
        """``work.wait()`` (from another thread if asked), with the timeline facts."""
        if thread:
            self._wait_in_thread(work)
        else:
            work.wait()
        ev.t_wait_return = self.now()
        ev.completed_after_wait = bool(work.is_completed())
        ev.waited_in_thread = thread
        self.waited.append((work, ev))

    def _wait_in_thread(self, work: Any) -> None:
        errors: list[BaseException] = []
        index = torch.cuda.current_device() if self.dev.cuda else None

        def target() -> None:
            try:
                if index is not None:
                    torch.cuda.set_device(index)  # a new thread starts on device 0
                work.wait()
            except BaseException as exc:  # re-raised in the rank's main thread
                errors.append(exc)

        th = threading.Thread(target=target, name="collective-wait", daemon=True)
        th.start()
        th.join()
        if errors:
            raise errors[0]

    def synchronized(self) -> None:
        """After a device synchronize: when it returned, and is_completed() of waited works."""
        if not self.dev.cuda:
            return
        t = self.now()
        for work, ev in self.waited:
            if ev.t_sync_return is None:
                ev.t_sync_return = t
                ev.completed_after_sync = bool(work.is_completed())

    def run(self, step: Step, index: int) -> None:
        """Execute one ordering step (``delay_stream``, ``write``, ``read``, ``future``)."""
        if step.kind == "delay_stream":
            self.dev.delay(float(step.value))
        elif step.kind == "write":
            name = step.bufs[0][1]
            t = self.bufs[name]
            value = tensors.materialize(step.value.for_rank(self.rank), tuple(t.shape), t.dtype,
                                        self.rank, self.world_size, self.env,
                                        self.inst.reduce_op).to(t.device)
            self.dev.delay(float(dict(step.args).get("delay", 0.0)))
            t.copy_(value)  # on CUDA: queued behind the sleep kernel on the current stream
            self.touched.add(name)
        elif step.kind == "read":
            self.snaps.append((step, index, self.bufs[step.bufs[0][1]].detach().clone()))
        elif step.kind == "future":
            self._future(step, index)

    def _future(self, step: Step, index: int) -> None:
        handle = step.waits[0]
        work = self.works.get(handle)
        if work is None:
            return  # this rank did not issue the op (like a wait on a handle it lacks)
        name = step.bufs[0][1] if step.bufs else None
        rec: dict[str, Any] = {"handle": handle, "step": index, "callback_ran": False,
                               "t_callback": None, "completed_in_callback": None}
        box: dict[str, torch.Tensor] = {}

        def callback(fut: Any) -> bool:
            fut.value()  # re-raises the op's error, if any
            rec["t_callback"] = round(self.now(), 6)
            rec["completed_in_callback"] = bool(work.is_completed())
            if name is not None:
                box["snap"] = self.bufs[name].detach().clone()
            return True

        work.get_future().then(callback).wait()
        rec["callback_ran"] = rec["t_callback"] is not None
        if name is not None and "snap" in box:
            self.snaps.append((step, index, box["snap"]))
        self.futures.append(rec)

    def results(self) -> dict[str, Any]:
        """Snapshot comparisons and future facts (call after the final synchronize)."""
        reads: list[dict[str, Any]] = []
        for step, index, snap in self.snaps:
            tname = step.bufs[0][1]
            fill = step.value.for_rank(self.rank) if step.value is not None else None
            entry: dict[str, Any] = {"name": step.handle, "tensor": tname, "step": index,
                                     "kind": step.kind, "expect": None,
                                     "digest": tensors.digest(snap)}
            reads.append(entry)
            if fill is None or fill.kind == "unspecified":
                continue
            if fill.kind == "stale":
                exp = self.before[tname]
            elif fill.kind == "final":
                exp = self.bufs[tname]
            else:
                exp = tensors.materialize(fill, tuple(snap.shape), snap.dtype, self.rank,
                                          self.world_size, self.env, self.inst.reduce_op)
            how = {"list": "explicit"}.get(fill.kind, fill.kind)
            check = tensors.compare(str(step.handle), snap, exp.to(snap.dtype), how,
                                    self.inst.tolerance)
            entry.update(expect=how, ok=check.ok, wrong=check.wrong, total=check.total,
                         wrong_text=wrong_text(check))
        out: dict[str, Any] = {}
        if reads:
            out["reads"] = reads
        if self.futures:
            out["futures"] = self.futures
        return out


def _store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no default group store (external launchers may differ): no alignment
        return None


class _Prober:
    """Runs the delayed probes of one shorthand async instance on this rank."""

    def __init__(self, inst: Instance, renv: Any, env: dict[str, Any]) -> None:
        from . import program

        assert inst.ordering is not None and inst.shorthand is not None
        self.program = program
        self.inst, self.renv, self.env = inst, renv, env
        self.plan = inst.ordering
        self.dev = Device(renv.device, max(SETTLE_MIN_S, SETTLE_DELAYS * self.plan.delay_s))
        self.step = inst.steps[0]
        self.in_name, self.out_name = inst.shorthand
        self.delayed = renv.rank == self.plan.delayed_rank
        self.store = _store()

    def fresh(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], set[str]]:
        bufs = self.program._build(self.inst, self.renv, self.env)
        before = {n: t.detach().cpu().clone() for n, t in bufs.items()}
        return bufs, before, set()

    def call(self, bufs: dict[str, torch.Tensor], touched: set[str], async_op: bool) -> Any:
        return self.program._call(self.inst, replace(self.step, async_op=async_op), self.renv,
                                  self.env, bufs, touched)

    def read(self, bufs: dict[str, torch.Tensor]) -> torch.Tensor:
        return bufs[self.out_name].detach().clone()  # on CUDA: a copy on the current stream

    def check(self, bufs: dict[str, torch.Tensor], before: dict[str, torch.Tensor],
              touched: set[str], snap: torch.Tensor | None = None) -> tuple[bool, bool, str]:
        """(all right, the output was checked on this rank, what was wrong)."""
        view = dict(bufs)
        if snap is not None:
            view[self.out_name] = snap
        checks = self.program._check(self.inst, self.renv, self.env, view, before, touched)
        bad = [c for c in checks if not c.ok]
        text = "; ".join(f"{c.tensor}: {wrong_text(c)}" for c in bad[:2])
        # Only an output the op writes here depends on the other ranks (not one left alone).
        depends = any(c.tensor == self.out_name and c.expectation not in ("untouched",
                                                                          "unchanged")
                      for c in checks)
        return not bad, depends, text

    def align(self, probe: str) -> None:
        """Let the delayed rank start its delay only once every other member is at the call."""
        if self.store is None:
            return
        key = f"collective-harness/ordering/{self.renv.seq}/{probe}"
        if not self.delayed:
            self.store.add(key, 1)
            return
        others = len(self.plan.members) - 1
        end = time.monotonic() + ALIGN_S
        while others and self.store.add(key, 0) < others and time.monotonic() < end:
            time.sleep(POLL_S)

    def post_wait(self) -> dict[str, Any]:
        bufs, before, touched = self.fresh()
        self.dev.sync()
        self.align("post_wait")
        if self.delayed:
            self.dev.delay(self.plan.delay_s)
        work = self.call(bufs, touched, True)
        at_return = bool(work.is_completed())
        early = self.read(bufs) if at_return else None
        work.wait()
        snap = self.read(bufs)
        after_wait = bool(work.is_completed())
        after_sync = None
        if self.dev.cuda:
            self.dev.sync()
            after_sync = bool(work.is_completed())
        self.dev.settle(work)
        imm_ok, checked, imm_wrong = self.check(bufs, before, touched, snap)
        set_ok, _, set_wrong = self.check(bufs, before, touched)
        obs: dict[str, Any] = {
            "delayed": self.delayed, "checked": checked, "completed_at_return": at_return,
            "at_return_ok": None, "at_return_wrong": "", "completed_after_wait": after_wait,
            "completed_after_sync": after_sync, "immediate_ok": imm_ok,
            "immediate_wrong": imm_wrong, "settled_ok": set_ok, "settled_wrong": set_wrong}
        if early is not None:
            ok, _, wrong = self.check(bufs, before, touched, early)
            obs.update(at_return_ok=ok, at_return_wrong=wrong)
        return obs

    def pre_op(self) -> dict[str, Any]:
        bufs, before, touched = self.fresh()
        inp = bufs[self.in_name]
        new = inp.detach().clone()
        inp.copy_(tensors.poison(tuple(inp.shape), inp.dtype).to(inp.device))
        warm = self.call(bufs, touched, True)  # the backend sees the buffer with old values
        warm.wait()
        self.dev.settle(warm)
        if self.out_name != self.in_name:
            out = bufs[self.out_name]
            out.copy_(tensors.poison(tuple(out.shape), out.dtype).to(out.device))
        self.dev.delay(self.plan.delay_s)  # the slow producer ...
        inp.copy_(new)  # ... whose write lands just before the call (CUDA: behind the sleep)
        work = self.call(bufs, touched, True)
        work.wait()
        self.dev.settle(work)
        ok, checked, wrong = self.check(bufs, before, touched)
        return {"ok": ok, "checked": checked, "wrong": wrong}

    def host_blocking(self) -> dict[str, Any]:
        bufs, before, touched = self.fresh()
        self.dev.sync()
        self.align("host_blocking")
        if self.delayed:
            self.dev.delay(self.plan.delay_s)
        t0 = time.perf_counter()
        self.call(bufs, touched, False)
        took = time.perf_counter() - t0
        snap = self.read(bufs)
        self.dev.sync()
        ok, checked, wrong = self.check(bufs, before, touched, snap)
        alone = self.dev.cuda and len(self.plan.members) == 1  # its stream is the slow one
        return {"delayed": self.delayed, "observer": checked and (not self.delayed or alone),
                "return_s": round(took, 6), "immediate_ok": ok, "immediate_wrong": wrong}


def run_probes(inst: Instance, renv: Any, env: dict[str, Any]) -> dict[str, Any]:
    """Run the instance's delayed probes on this rank (members of the op only)."""
    plan = inst.ordering
    if plan is None or not plan.probes or renv.rank not in plan.members:
        return {}
    prober = _Prober(inst, renv, env)
    probes = {"post_wait": prober.post_wait(), "pre_op": prober.pre_op(),
              "host_blocking": prober.host_blocking()}
    prober.dev.sync()
    return {"probes": probes}
