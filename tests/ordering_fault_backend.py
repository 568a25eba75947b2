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

The plumbing is :class:`harness.backends.wrapping.WrappingProcessGroup`'s; the faults are its
``prepare`` (staged reads) and ``finish`` (the Work's completion semantics) hooks.
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

from harness.backends.wrapping import Call, WrappedWork, WrappingProcessGroup

FAULTS = ("none", "early_wait", "early_complete", "early_input_read")
STAGE_AFTER_S = 0.002  # the prefetch lands this long after an op completes
# Methods whose input buffer is also the output (a staged copy is written into it) and
# methods that read separate inputs (the staged copy is sent instead); a broadcast's root reads.
READS_IN_PLACE = ("allreduce", "reduce", "broadcast")
READS = ("allgather", "gather", "scatter", "reduce_scatter", "alltoall", "send")
PASSED_THROUGH = ("barrier",)  # not wrapped: its Work is Gloo's own


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


class FaultyOrderingGloo(WrappingProcessGroup):
    """Delegates every op to a real ProcessGroupGloo; breaks ordering as ``fault`` says."""

    backend_name = "faulty_ordering"

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(store, rank, size, timeout)
        self.fault = os.environ.get("COLLECTIVE_FAULT", "none")
        if self.fault not in FAULTS:
            raise ValueError(f"COLLECTIVE_FAULT={self.fault!r}; choose one of {FAULTS}")
        self.stager = _Stager()

    def prepare(self, call: Call) -> None:
        """Under ``early_input_read`` the op reads staged copies of its inputs."""
        call.notes["given"] = list(call.inputs)
        if self.fault != "early_input_read":
            return
        in_place = call.method in READS_IN_PLACE
        if call.method == "broadcast" and self.rank() != call.root:
            return
        if not in_place and call.method not in READS:
            return
        reads: list[torch.Tensor] = []
        for t in call.inputs:
            old = self.stager.staged(t)
            if old is not None and in_place:
                t.copy_(old)  # the op works on (and writes into) the buffer it was given
            reads.append(t if old is None or in_place else old)
        call.inputs = reads

    def finish(self, call: Call, work: Any) -> Any:
        if call.method in PASSED_THROUGH:
            return work
        given = call.notes["given"]
        if self.fault == "early_input_read" and given:
            self.stager.stage_later(work, given)
        mode = self.fault if self.fault in ("early_wait", "early_complete") else ""
        return WrappedWork(work, None, (), mode)


FaultyOrderingGloo.register()
