"""What a program does on one rank besides op calls: waits, streams, ordering steps, timeline.

"The current stream" is a CUDA stream for CUDA tensors; for CPU tensors the host is the stream,
so stream work is host work there: a delay is a host sleep and a read is a host copy.
:class:`Device` says what slow work, synchronize and settle mean on this rank's device;
:class:`ProgramState` executes the ordering steps (``delay_stream``, ``write``, ``read``,
``future``), waits on works (also from another thread), and records the timeline facts and
snapshots that the parent judges (:mod:`harness.ordering.verdicts`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..model import Instance, Step, StepEvent, TensorCheck
from . import tensors

STEP_KINDS = frozenset({"delay_stream", "write", "read", "future", "wait_tensor"})
SETTLE_MIN_S = 0.25  # shortest settle poll on CPU (see harness.ordering.probes)
POLL_S = 0.0005
# How often a settle re-checks the output's values (a check costs far more than is_completed()).
READY_POLL_S = 0.005
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


def _transform(how: str, by: Any, fut: Any) -> Any:
    """One callback of a ``then`` chain: every tensor of the future's value times/plus ``by``
    (a fixed vocabulary: nothing from the case file is evaluated)."""
    value = fut.value()
    if isinstance(value, list | tuple):
        return [t * by if how == "mul" else t + by for t in value]
    return value * by if how == "mul" else value + by


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

    def settle(self, work: Any, ready: Callable[[], bool] | None = None) -> None:
        """Make sure ``work`` finished, without trusting ``wait()`` (for settled reads).

        On CPU this polls ``is_completed()`` for at most ``settle_s``. ``ready``, when given,
        is a check of the output's values: a Work that never reports completion (Gloo's
        reduce_scatter on torch 2.13) would otherwise cost the whole ``settle_s`` every time,
        so the poll also ends once the output holds the right values. It is only consulted
        while ``is_completed()`` is False, so a Work that reports completion settles exactly
        as before; a wrong output still waits the whole ``settle_s`` for a late result.
        """
        if self.cuda:
            torch.cuda.synchronize()
            return
        end = time.monotonic() + self.settle_s
        next_check = time.monotonic()
        while not work.is_completed() and time.monotonic() < end:
            if ready is not None and time.monotonic() >= next_check:
                if ready():
                    return
                next_check = time.monotonic() + READY_POLL_S
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
        # Futures of ``held: true`` steps, waited at the program's end (wait_held).
        self.held: list[tuple[Any, dict[str, Any], dict[str, torch.Tensor], Step, int]] = []
        self._side: Any = None
        # Receive buffers snapshotted when a p2p Work said is_completed() at return, by event.
        self.early: dict[int, tuple[StepEvent, dict[str, torch.Tensor]]] = {}

    @property
    def side(self) -> Any:
        """The side CUDA stream ops with ``stream: side`` ran on (None before the first)."""
        return self._side

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

    def returned(self, work: Any, ev: StepEvent, receives: list[str]) -> None:
        """Record ``is_completed()`` at return; when it is True for an op that receives into
        ``receives`` (point to point), snapshot them: they must already hold the data."""
        ev.completed_at_return = bool(work.is_completed())
        if ev.completed_at_return and receives:
            self.early[id(ev)] = (ev, {n: self.bufs[n].detach().clone() for n in receives})

    def touching(self, names: list[str]) -> None:
        """A step is about to use these buffers: a change after it proves nothing about the
        early completion of an earlier op, so its snapshots of them are dropped."""
        for key, (_, snaps) in list(self.early.items()):
            if any(n in snaps for n in names):
                del self.early[key]

    def wait(self, work: Any, ev: StepEvent, thread: bool = False) -> None:
        """``work.wait()`` (from another thread if asked), with the timeline facts."""
        if thread:
            self._wait_in_thread(work)
        else:
            work.wait()
        ev.t_wait_return = self.now()
        ev.completed_after_wait = bool(work.is_completed())
        ev.waited_in_thread = thread
        pending = self.early.pop(id(ev), None)
        if pending is not None:
            ev.at_return_in_place = all(tensors.digest(snap) == tensors.digest(self.bufs[n])
                                        for n, snap in pending[1].items())
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
            self.touching([name])
            self.dev.delay(float(dict(step.args).get("delay", 0.0)))
            t.copy_(value)  # on CUDA: queued behind the sleep kernel on the current stream
            self.touched.add(name)
        elif step.kind == "read":
            self.snaps.append((step, index, self.bufs[step.bufs[0][1]].detach().clone()))
        elif step.kind == "future":
            self._future(step, index)
        elif step.kind == "wait_tensor":
            # Importing the module registers the c10d_functional op namespace.
            import torch.distributed._functional_collectives

            torch.ops.c10d_functional.wait_tensor(self.bufs[step.bufs[0][1]])

    def _future(self, step: Step, index: int) -> None:
        handle = step.waits[0]
        work = self.works.get(handle)
        if work is None:
            return  # this rank did not issue the op (like a wait on a handle it lacks)
        name = step.bufs[0][1] if step.bufs else None
        rec: dict[str, Any] = {"handle": handle, "step": index, "callback_ran": False,
                               "t_callback": None, "completed_in_callback": None}
        then = dict(step.args).get("then")
        if then:
            self._chain(step, index, work, then, rec)
            return
        box: dict[str, torch.Tensor] = {}

        def callback(fut: Any) -> bool:
            fut.value()  # re-raises the op's error, if any
            rec["t_callback"] = round(self.now(), 6)
            rec["completed_in_callback"] = bool(work.is_completed())
            if name is not None:
                result = dict(step.args).get("result")
                held = (self.bufs[name] if result is None else
                        future_tensor(fut.value(), None if result is True else int(result)))
                box["snap"] = held.detach().clone()
            return True

        fut = work.get_future().then(callback)
        if dict(step.args).get("held"):
            self.held.append((fut, rec, box, step, index))
            return
        fut.wait()
        self._settle_future(rec, box, step, index)

    def _settle_future(self, rec: dict[str, Any], box: dict[str, torch.Tensor], step: Step,
                       index: int) -> None:
        rec["callback_ran"] = rec["t_callback"] is not None
        if step.bufs and "snap" in box:
            self.snaps.append((step, index, box["snap"]))
        self.futures.append(rec)

    def wait_held(self) -> None:
        """Wait for the futures of ``held: true`` steps, in the order they were asked for
        (call once every Work was waited); a future that never completes is a hang."""
        held, self.held = self.held, []
        for fut, rec, box, step, index in held:
            fut.wait()
            self._settle_future(rec, box, step, index)

    def _chain(self, step: Step, index: int, work: Any, then: tuple[tuple[str, Any], ...],
               rec: dict[str, Any]) -> None:
        """``get_future().then(f1).then(f2)...wait()``; the value's first tensor is kept as
        the step's snapshot (upstream compares ``res[0]``)."""
        fut = work.get_future()
        for how, by in then:
            fut = fut.then(functools.partial(_transform, how, by))
        value = fut.wait()
        rec["t_callback"] = round(self.now(), 6)
        rec["callback_ran"] = True
        first = value[0] if isinstance(value, list | tuple) and value else value
        if not isinstance(first, torch.Tensor):
            raise RuntimeError(f"the future chain of {step.waits[0]!r} returned "
                               f"{type(value).__name__}, not tensors")
        self.snaps.append((step, index, first.detach().clone()))
        self.futures.append(rec)

    def results(self) -> dict[str, Any]:
        """Snapshot comparisons and future facts (call after the final synchronize)."""
        reads: list[dict[str, Any]] = []
        for step, index, snap in self.snaps:
            tname = step.bufs[0][1] if step.bufs else f"value of {step.waits[0]}"
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


def future_tensor(value: Any, index: int | None = None) -> torch.Tensor:
    """The tensor of a Work's future that a future step's ``result:`` names: with ``index``
    None the value's one tensor (the value itself, or the only element of a one-element
    list, what ``get_future()`` of a collective on one tensor returns), else entry ``index``
    of the value's list."""
    if index is None and isinstance(value, torch.Tensor):
        return value
    entries = list(value) if isinstance(value, list | tuple) else None
    if index is None and entries is not None and len(entries) == 1:
        index = 0
    if (entries is not None and index is not None and index < len(entries)
            and isinstance(entries[index], torch.Tensor)):
        held: torch.Tensor = entries[index]
        return held
    what = f"a {type(value).__name__}" + (f" of {len(entries)}" if entries is not None else "")
    want = "one tensor" if index is None else f"a list with a tensor at index {index}"
    raise RuntimeError(f"the future's value is {what}; 'result' needs {want}")
