"""A backend that computes right values but breaks the async contract (ordering tests).

Gloo behind a Python ``ProcessGroup``, registered as ``faulty_ordering``; import it with
``--backend-module tests.ordering_fault_backend --backend faulty_ordering``. It is separate
from ``tests/fault_backend.py`` (value faults) so the two can change independently.
``COLLECTIVE_FAULT`` (read in each rank when the process group is created) picks the fault:

- ``none``: a faithful wrapper (every ordering check must pass);
- ``early_wait``: ``Work.wait()`` returns at once, before the result is in place; the data
  lands whenever Gloo finishes; ``is_completed()`` tells the truth;
- ``early_complete``: ``is_completed()`` is True from the moment the call returns, before the
  collective ran; ``wait()`` is faithful;
- ``early_input_read``: the backend reads its input before the producer finished: a moment
  after an op completes it stages a copy of the op's input buffers ("prefetching" the next
  iteration), and the next op on the same buffer sends that staged copy, so a write that lands
  after the staging (a slow producer) is ignored. A fresh buffer is read at the call.
"""

# mypy: disable-error-code="override,call-arg,misc"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

import os
import threading
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

FAULTS = ("none", "early_wait", "early_complete", "early_input_read")
STAGE_AFTER_S = 0.002  # the prefetch lands this long after an op completes


class _Work(dist.Work):
    """Delegates to a Gloo work, with ``wait()`` / ``is_completed()`` broken as the fault says."""

    def __init__(self, inner: Any, fault: str) -> None:
        super().__init__()
        self.inner = inner
        self.fault = fault

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self.fault == "early_wait":
            return True
        return bool(self.inner.wait()) if timeout is None else bool(self.inner.wait(timeout))

    def is_completed(self) -> bool:
        if self.fault == "early_complete":
            return True
        return bool(self.inner.is_completed())

    def is_success(self) -> bool:
        return bool(self.inner.is_success())

    def exception(self) -> Any:
        return self.inner.exception()

    def get_future(self) -> Any:
        return self.inner.get_future()


def _call(fn: Any, *args: Any, opts: Any = None) -> Any:
    """Call an inner Gloo method with the caller's options, or its defaults: torch 2.4 calls a
    Python ProcessGroup's methods from Python, some without options (``allgather``)."""
    return fn(*args) if opts is None else fn(*args, opts)


def _owner(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


class _Stager:
    """Staged copies of input buffers, keyed by address, valid while the buffer lives."""

    def __init__(self) -> None:
        self.copies: dict[int, tuple[Any, torch.Tensor]] = {}

    def stage_later(self, work: Any, inputs: list[torch.Tensor]) -> None:
        def stage() -> None:
            for t in inputs:
                self.copies[t.data_ptr()] = (weakref.ref(_owner(t)), t.detach().clone())

        def on_done(fut: Any) -> None:
            threading.Timer(STAGE_AFTER_S, stage).start()

        try:
            fut = work.get_future()
        except RuntimeError:  # Gloo's send/recv works have no future: nothing is staged
            return
        fut.add_done_callback(on_done)

    def staged(self, t: torch.Tensor) -> torch.Tensor | None:
        entry = self.copies.get(t.data_ptr())
        if entry is None or entry[0]() is None:
            return None
        copy = entry[1]
        return copy if copy.shape == t.shape and copy.dtype == t.dtype else None


class FaultyOrderingGloo(dist.ProcessGroup):
    """Delegates every op to a real ProcessGroupGloo; breaks ordering as ``fault`` says."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.inner: Any = ProcessGroupGloo(store, rank, size, timeout)
        self.fault = os.environ.get("COLLECTIVE_FAULT", "none")
        if self.fault not in FAULTS:
            raise ValueError(f"COLLECTIVE_FAULT={self.fault!r}; choose one of {FAULTS}")
        self.stager = _Stager()

    def getBackendName(self) -> str:
        return "faulty_ordering"

    def _reads(self, tensors: list[torch.Tensor], in_place: bool) -> list[torch.Tensor]:
        """The tensors the op will read: staged copies under ``early_input_read``."""
        if self.fault != "early_input_read":
            return tensors
        out: list[torch.Tensor] = []
        for t in tensors:
            old = self.stager.staged(t)
            if old is not None and in_place:
                t.copy_(old)  # the op works on (and writes into) the buffer it was given
            out.append(t if old is None or in_place else old)
        return out

    def _work(self, inner: Any, inputs: list[torch.Tensor]) -> _Work:
        if self.fault == "early_input_read" and inputs:
            self.stager.stage_later(inner, inputs)
        return _Work(inner, self.fault)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        self._reads(tensors, in_place=True)
        return self._work(_call(self.inner.allreduce, tensors, opts=opts), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        self._reads(tensors, in_place=True)
        return self._work(_call(self.inner.reduce, tensors, opts=opts), tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        if self.rank() == (opts.rootRank if opts is not None else 0):
            self._reads(tensors, in_place=True)
        return self._work(_call(self.inner.broadcast, tensors, opts=opts), tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Any:
        reads = self._reads(inputs, in_place=False)
        return self._work(_call(self.inner.allgather, outputs, reads, opts=opts), inputs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> Any:
        reads = self._reads(inputs, in_place=False)
        return self._work(_call(self.inner.gather, outputs, reads, opts=opts), inputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        flat = inputs[0] if inputs else []
        reads = [self._reads(flat, in_place=False)] if inputs else inputs
        return self._work(_call(self.inner.scatter, outputs, reads, opts=opts), flat)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        flat = inputs[0]
        reads = [self._reads(flat, in_place=False)]
        return self._work(_call(self.inner.reduce_scatter, outputs, reads, opts=opts), flat)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> Any:
        reads = self._reads(inputs, in_place=False)
        return self._work(_call(self.inner.alltoall, outputs, reads, opts=opts), inputs)

    def _get_backend(self, device: Any) -> Any:
        """torch 2.15's batch_isend_irecv asks whether the group's backend coalesces: answer
        with the wrapped Gloo (the ops themselves still go through this group)."""
        return self.inner

    def barrier(self, opts: Any = None) -> Any:
        return _call(self.inner.barrier, opts=opts)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        reads = self._reads(tensors, in_place=False)
        return self._work(self.inner.send(reads, dst, tag), tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._work(self.inner.recv(tensors, src, tag), [])

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._work(self.inner.recv_anysource(tensors, tag), [])


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> FaultyOrderingGloo:
    return FaultyOrderingGloo(store, rank, size, timeout)


dist.Backend.register_backend("faulty_ordering", _create, devices=["cpu"])
