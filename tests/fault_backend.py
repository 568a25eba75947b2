"""A third-party backend for tests: Gloo behind a Python ``ProcessGroup`` that injects faults.

Import it with ``--backend-module tests.fault_backend`` (or ``fault_backend`` with ``tests/`` on
the path) and run ``--backend faulty``. ``COLLECTIVE_FAULT`` (read in each rank when the
process group is created) picks the fault:

- ``none``: a faithful wrapper (the whole suite must pass);
- ``wrong_value``: rank 1 changes the first element of every output it receives (adds 1;
  flips a bool);
- ``missing_contribution``: the last rank's contribution to every reduction and gather is
  replaced by zeros (on a copy: its own input stays intact);
- ``misplaced_chunk``: outputs made of per-rank chunks get two chunks swapped (gathers,
  all-to-alls), and reduce-scatters and scatters hand each rank another rank's chunk;
- ``unwritten``: the last element of every output keeps the value it had before the op;
- ``stale_on_reuse``: an output buffer used before (same address and size) gets the values
  of its first use back (a result cache keyed by address that is never invalidated).

Every op the harness's op table calls is wrapped: all_reduce, reduce, broadcast, all_gather
(list and single-tensor forms), gather, scatter, reduce_scatter (list and single-tensor),
all_to_all (list and single), the coalesced forms, barrier, send/recv (and from any source).
The object collectives travel through these, so their faults show as corrupted objects.

The plumbing (every method, torch 2.4's names and missing options, torch 2.15's
``_get_backend``) is :class:`harness.backends.wrapping.WrappingProcessGroup`'s; this wrapper turns
on its ``compose_missing``, so the ops torch 2.4's Gloo lacks or gets wrong (list reduce_scatter
and alltoall, reduce_scatter_tensor with a reduce op other than SUM) are built from others and
the backend under test offers the whole API on every torch version.
"""

# mypy: disable-error-code="override,call-arg,misc"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch

from harness.backends.wrapping import Call, WrappedWork, WrappingProcessGroup

FAULTS = ("none", "wrong_value", "missing_contribution", "misplaced_chunk", "unwritten",
          "stale_on_reuse")
# Ops whose inputs are the outputs (the fault zeroes them in place) and ops whose last rank's
# contribution is replaced by zeros on a copy (``missing_contribution``).
IN_PLACE = ("allreduce", "allreduce_coalesced", "reduce")
CONTRIBUTED = ("reduce_scatter", "reduce_scatter_single", "gather", "allgather",
               "all_gather_single", "allgather_coalesced")
# The ops whose Work the fault wraps (send and barrier are passed through untouched).
UNWRAPPED = ("send", "barrier")


def _rotate(items: list[Any]) -> list[Any]:
    """Every rank gets its neighbour's piece (``misplaced_chunk`` for scatters)."""
    return items[1:] + items[:1] if len(items) >= 2 else items


class FaultyGloo(WrappingProcessGroup):
    """Delegates every op to a real ProcessGroupGloo, then applies ``fault``."""

    backend_name = "faulty"
    compose_missing = True

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(store, rank, size, timeout)
        self.fault = os.environ.get("COLLECTIVE_FAULT", "none")
        if self.fault not in FAULTS:
            raise ValueError(f"COLLECTIVE_FAULT={self.fault!r}; choose one of {FAULTS}")
        self.first: dict[tuple[int, int], torch.Tensor] = {}  # stale_on_reuse: first results

    def prepare(self, call: Call) -> None:
        fault, last = self.fault, self.rank() == self.size() - 1
        if fault == "unwritten":
            # Copies taken before the op is issued: an async Gloo op may already have written
            # its outputs by the time finish() runs (a copy taken then would hold the result).
            call.notes["saved"] = [t.clone() for t in call.outputs if t.numel()]
        if fault == "missing_contribution" and last:
            if call.method in IN_PLACE:
                for t in call.inputs:
                    t.zero_()
            elif call.method in CONTRIBUTED:
                call.inputs = [torch.zeros_like(t) for t in call.inputs]
        if fault == "misplaced_chunk":
            if call.method in ("reduce_scatter", "scatter"):
                call.inputs = _rotate(call.inputs)
            elif call.method == "reduce_scatter_single" and call.inputs[0].numel():
                call.inputs = [torch.cat(_rotate(list(call.inputs[0].chunk(self.size()))))]

    def finish(self, call: Call, work: Any) -> Any:
        if call.method in UNWRAPPED:
            return work
        fault, rank = self.fault, self.rank()
        outputs = [t for t in call.outputs if t.numel()]
        chunks, saved = call.chunks, call.notes.get("saved", [])

        def after() -> None:
            if fault == "wrong_value" and rank == 1:
                for t in outputs:
                    first = (0,) * t.dim()
                    if t.dtype == torch.bool:
                        t[first] = not bool(t[first])
                    else:
                        t[first] += 1
            elif fault == "misplaced_chunk" and len(chunks) >= 2 and chunks[0].numel():
                a = chunks[0].clone()
                chunks[0].copy_(chunks[1])
                chunks[1].copy_(a)
            elif fault == "stale_on_reuse":
                for t in outputs:
                    key = (t.data_ptr(), t.numel() * t.element_size())
                    if key in self.first:
                        t.copy_(self.first[key])
                    else:
                        self.first[key] = t.clone()
            elif fault == "unwritten" and outputs:
                last, before = outputs[-1], saved[-1]
                idx = tuple(s - 1 for s in last.shape)
                last[idx] = before[idx]

        return WrappedWork(work, after)


FaultyGloo.register()
