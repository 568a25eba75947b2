"""A third-party backend for tests: Gloo behind a Python ``ProcessGroup`` that injects faults.

Import it with ``--backend-module tests.fault_backend`` (or ``fault_backend`` with ``tests/`` on
the path) and run ``--backend faulty``. ``COLLECTIVE_FAULT`` (read in each rank when the
process group is created) picks the fault:

- ``none``: a faithful wrapper (the whole suite must pass);
- ``wrong_value``: rank 1 adds 1 to the first element of each collective's result;
- ``missing_contribution``: the last rank's input to all_reduce/reduce is dropped (zeros);
- ``misplaced_chunk``: all_gather/all_to_all outputs have their first two chunks swapped;
- ``unwritten``: the last element of every all_gather/gather output is left as it was.
"""

# mypy: disable-error-code="override,call-arg,misc"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

FAULTS = ("none", "wrong_value", "missing_contribution", "misplaced_chunk", "unwritten")


class _AfterWork(dist.Work):
    """A Work that runs ``after`` once the inner work completes (the fault is applied then)."""

    def __init__(self, inner: Any, after: Callable[[], None]) -> None:
        super().__init__()
        self.inner = inner
        self.after = after
        self.done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        ok = bool(self.inner.wait()) if timeout is None else bool(self.inner.wait(timeout))
        if not self.done:
            self.done = True
            self.after()
        return ok

    def is_completed(self) -> bool:
        return bool(self.inner.is_completed()) and self.done

    def is_success(self) -> bool:
        return bool(self.inner.is_success())

    def exception(self) -> Any:
        return self.inner.exception()

    def get_future(self) -> Any:
        return self.inner.get_future()


class FaultyGloo(dist.ProcessGroup):
    """Delegates every op to a real ProcessGroupGloo, then applies ``fault``."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.inner: Any = ProcessGroupGloo(store, rank, size, timeout)
        self.fault = os.environ.get("COLLECTIVE_FAULT", "none")
        if self.fault not in FAULTS:
            raise ValueError(f"COLLECTIVE_FAULT={self.fault!r}; choose one of {FAULTS}")

    def getBackendName(self) -> str:
        return "faulty"

    def _wrap(self, work: Any, outputs: list[torch.Tensor], chunked: bool = False,
              touched: list[torch.Tensor] | None = None) -> Any:
        fault, rank = self.fault, self.rank()
        saved = [t.clone() for t in (touched or [])]

        def after() -> None:
            if fault == "wrong_value" and rank == 1:
                for t in outputs:
                    if t.numel():
                        t.view(-1)[0] += 1
            elif fault == "misplaced_chunk" and chunked and len(outputs) >= 2:
                a = outputs[0].clone()
                outputs[0].copy_(outputs[1])
                outputs[1].copy_(a)
            elif fault == "unwritten" and touched:
                last, before = touched[-1], saved[-1]
                if last.numel():
                    last.view(-1)[-1] = before.view(-1)[-1]

        return _AfterWork(work, after)

    def _drop(self, tensors: list[torch.Tensor]) -> None:
        if self.fault == "missing_contribution" and self.rank() == self.size() - 1:
            for t in tensors:
                t.zero_()

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._drop(tensors)
        return self._wrap(self.inner.allreduce(tensors, opts), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self._drop(tensors)
        return self._wrap(self.inner.reduce(tensors, opts), tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self._wrap(self.inner.broadcast(tensors, opts), tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any) -> Any:
        flat = outputs[0]
        return self._wrap(self.inner.allgather(outputs, inputs, opts), flat, chunked=True,
                          touched=flat)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any) -> Any:
        flat = outputs[0] if outputs else []
        return self._wrap(self.inner.gather(outputs, inputs, opts), flat, chunked=True,
                          touched=flat)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any) -> Any:
        return self._wrap(self.inner.scatter(outputs, inputs, opts), outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any) -> Any:
        return self._wrap(self.inner.reduce_scatter(outputs, inputs, opts), outputs)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any) -> Any:
        return self._wrap(self.inner.alltoall(outputs, inputs, opts), outputs, chunked=True)

    def barrier(self, opts: Any) -> Any:
        return self.inner.barrier(opts)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._wrap(self.inner.recv(tensors, src, tag), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._wrap(self.inner.recv_anysource(tensors, tag), tensors)


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> FaultyGloo:
    return FaultyGloo(store, rank, size, timeout)


dist.Backend.register_backend("faulty", _create, devices=["cpu"])
