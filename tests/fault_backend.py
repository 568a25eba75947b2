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
- ``unwritten``: the last element of every output keeps the value it had before the op.

Every op the harness's op table calls is wrapped: all_reduce, reduce, broadcast, all_gather
(list and single-tensor forms), gather, scatter, reduce_scatter (list and single-tensor),
all_to_all (list and single), the coalesced forms, barrier, send/recv (and from any source).
The object collectives travel through these, so their faults show as corrupted objects.

It is written against every torch the harness supports (2.4 to the newest), whose Python
ProcessGroup API differs (README "Torch versions"):

- torch 2.4 calls a Python ProcessGroup's methods from Python, some without options
  (``allgather(outputs, inputs)``) and under older names (``_allgather_base``,
  ``_reduce_scatter_base``, ``allgather_into_tensor_coalesced``,
  ``reduce_scatter_tensor_coalesced``); newer torch calls them from C++, with options, as
  ``all_gather_single`` and so on. Every method takes optional options and both names exist.
- torch 2.4's Gloo has no list ``reduce_scatter`` and no list ``alltoall`` ("does not
  support"): the wrapper then builds them from ``allreduce`` and ``alltoall_base``, so that
  the backend under test offers the whole API on every version.
- torch 2.4's Gloo ``reduce_scatter_tensor`` returns the SUM whatever the reduce op: the
  wrapper then builds the other ops from ``allreduce``.
- torch 2.15's ``batch_isend_irecv`` asks the group for its backend (``_get_backend``), which
  a Python ProcessGroup does not have ("No backend type associated with device type cpu"):
  the group answers with the Gloo it wraps, which does not coalesce, so the point-to-point
  ops still run one by one through this wrapper.
"""

# mypy: disable-error-code="override,call-arg,misc,assignment"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

# torch 2.4's Gloo reduce_scatter_tensor ignores the reduce op and returns the SUM (observed on
# torch 2.4.1, see cases/reduce_scatter.yaml); the wrapper composes the other ops itself there.
RS_TENSOR_SUMS = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5)
FAULTS = ("none", "wrong_value", "missing_contribution", "misplaced_chunk", "unwritten")


class _AfterWork(dist.Work):
    """A Work that runs ``after`` once the inner works complete (the fault is applied then)."""

    def __init__(self, inner: Any, after: Callable[[], None], more: Sequence[Any] = ()) -> None:
        super().__init__()
        self.inner = inner
        self.more = list(more)
        self.after = after
        self.done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        for w in self.more:
            w.wait()
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


def _call(fn: Callable[..., Any], *args: Any, opts: Any = None) -> Any:
    """Call an inner Gloo method with the caller's options, or with its defaults when the
    caller (torch 2.4 calling from Python) passed none."""
    return fn(*args) if opts is None else fn(*args, opts)


def _tensors(args: Any) -> list[torch.Tensor]:
    """Every tensor in ``args`` (nested lists and tuples included)."""
    if isinstance(args, torch.Tensor):
        return [args]
    if isinstance(args, (list, tuple)):
        return [t for a in args for t in _tensors(a)]
    return []


def _lacks(exc: RuntimeError) -> bool:
    """Gloo rejected the op as unsupported (torch 2.4's list reduce_scatter and alltoall)."""
    return "does not support" in str(exc)


def _chunks(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``t`` split along dim 0 into ``n`` equal views (empty list if it does not divide)."""
    if n < 2 or t.dim() == 0 or t.shape[0] % n:
        return []
    return list(t.chunk(n)) if t.shape[0] else []


class FaultyGloo(dist.ProcessGroup):
    """Delegates every op to a real ProcessGroupGloo, then applies ``fault``."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.inner: Any = ProcessGroupGloo(store, rank, size, timeout)
        self.fault = os.environ.get("COLLECTIVE_FAULT", "none")
        if self.fault not in FAULTS:
            raise ValueError(f"COLLECTIVE_FAULT={self.fault!r}; choose one of {FAULTS}")
        self._pre: dict[int, torch.Tensor] = {}  # copies taken before an op (``unwritten``)

    def getBackendName(self) -> str:
        return "faulty"

    # -- fault plumbing ------------------------------------------------------------------
    def _issue(self, fn: Callable[..., Any], *args: Any, opts: Any = None) -> Any:
        """Call the inner method; under ``unwritten`` first keep a copy of every tensor it is
        given, because an async Gloo op may already have written its outputs by the time
        :meth:`_wrap` runs (a copy taken then held the result, and the fault did not show)."""
        if self.fault == "unwritten":
            self._pre = {id(t): t.clone() for t in _tensors(args)}
        return _call(fn, *args, opts=opts)

    def _wrap(self, work: Any, outputs: Sequence[torch.Tensor],
              chunks: Sequence[torch.Tensor] = (), more: Sequence[Any] = ()) -> Any:
        """Apply the output-side faults to ``outputs`` when ``work`` completes.

        ``chunks`` are the per-rank pieces of the output (for ``misplaced_chunk``).
        """
        fault, rank = self.fault, self.rank()
        outputs = [t for t in outputs if t.numel()]
        pre = self._pre
        saved = ([pre[id(t)] if id(t) in pre else t.clone() for t in outputs]
                 if fault == "unwritten" else [])
        self._pre = {}

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
            elif fault == "unwritten" and outputs:
                last, before = outputs[-1], saved[-1]
                idx = tuple(s - 1 for s in last.shape)
                last[idx] = before[idx]

        return _AfterWork(work, after, more)

    def _contribution(self, t: torch.Tensor) -> torch.Tensor:
        """What this rank contributes: zeros on the last rank under ``missing_contribution``."""
        if self.fault == "missing_contribution" and self.rank() == self.size() - 1:
            return torch.zeros_like(t)
        return t

    def _drop_in_place(self, tensors: list[torch.Tensor]) -> None:
        if self.fault == "missing_contribution" and self.rank() == self.size() - 1:
            for t in tensors:
                t.zero_()

    def _rotate(self, items: list[Any]) -> list[Any]:
        """``misplaced_chunk`` for scatters: every rank gets its neighbour's piece."""
        if self.fault == "misplaced_chunk" and len(items) >= 2:
            return items[1:] + items[:1]
        return items

    # -- reductions --------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        self._drop_in_place(tensors)
        return self._wrap(self._issue(self.inner.allreduce, tensors, opts=opts), tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        self._drop_in_place(tensors)
        return self._wrap(self._issue(self.inner.allreduce_coalesced, tensors, opts=opts), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        self._drop_in_place(tensors)
        return self._wrap(self._issue(self.inner.reduce, tensors, opts=opts), tensors)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        inputs = [self._rotate([self._contribution(t) for t in lst]) for lst in inputs]
        try:
            work = self._issue(self.inner.reduce_scatter, outputs, inputs, opts=opts)
        except RuntimeError as exc:
            if not _lacks(exc):
                raise
            # All-reduce the stacked list, keep this rank's entry: every reduce op works.
            stacked = torch.stack(inputs[0])
            ar = dist.AllreduceOptions()
            ar.reduceOp = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
            out, mine = outputs[0], stacked[self.rank()]

            def keep_mine() -> None:
                out.copy_(mine)

            work = _AfterWork(self.inner.allreduce([stacked], ar), keep_mine)
        return self._wrap(work, outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Any:
        src = self._contribution(input)
        if self.fault == "misplaced_chunk":
            src = torch.cat(self._rotate(list(src.chunk(self.size())))) if src.numel() else src
        if RS_TENSOR_SUMS and opts is not None and opts.reduceOp != dist.ReduceOp.SUM:
            # torch 2.4's Gloo would return the SUM: all-reduce a copy, keep this rank's chunk.
            whole = src.clone()
            ar = dist.AllreduceOptions()
            ar.reduceOp = opts.reduceOp
            mine = whole.reshape(self.size(), -1)[self.rank()]

            def keep_mine() -> None:
                output.copy_(mine.reshape(output.shape))

            work = _AfterWork(self.inner.allreduce([whole], ar), keep_mine)
            return self._wrap(work, [output])
        work = self._issue(self.inner._reduce_scatter_base, output, src, opts=opts)
        return self._wrap(work, [output])

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs,
                                                                        strict=True)]
        return _AfterWork(works[-1], lambda: None, works[:-1])

    # -- one to all / all to one -----------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._wrap(self._issue(self.inner.broadcast, tensors, opts=opts), tensors)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        inputs = [self._rotate(list(lst)) for lst in inputs]
        return self._wrap(self._issue(self.inner.scatter, outputs, inputs, opts=opts), outputs)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> Any:
        flat = outputs[0] if outputs else []
        inputs = [self._contribution(t) for t in inputs]
        work = self._issue(self.inner.gather, outputs, inputs, opts=opts)
        return self._wrap(work, flat, chunks=flat)

    # -- gathers and all-to-alls -----------------------------------------------------------
    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Any:
        flat = outputs[0]
        inputs = [self._contribution(t) for t in inputs]
        work = self._issue(self.inner.allgather, outputs, inputs, opts=opts)
        return self._wrap(work, flat, chunks=flat)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Any:
        work = self._issue(self.inner._allgather_base, output, self._contribution(input), opts=opts)
        return self._wrap(work, [output], chunks=_chunks(output, self.size()))

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs,
                                                                    strict=True)]
        return _AfterWork(works[-1], lambda: None, works[:-1])

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> Any:
        inputs = [self._contribution(t) for t in inputs]
        work = self._issue(self.inner.allgather_coalesced, outputs, inputs, opts=opts)
        flat = [t for lst in outputs for t in lst]
        # The per-rank pieces: swap the first entries that ranks 0 and 1 contributed.
        firsts = [lst[0] for lst in outputs] if len(outputs) >= 2 else []
        return self._wrap(work, flat, chunks=firsts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> Any:
        try:
            work = self._issue(self.inner.alltoall, outputs, inputs, opts=opts)
        except RuntimeError as exc:
            if not _lacks(exc):
                raise
            # One flat all_to_all_single with per-peer element counts, copied back after.
            sent = torch.cat([t.reshape(-1) for t in inputs])
            got = sent.new_empty(sum(t.numel() for t in outputs))
            splits_out = [t.numel() for t in outputs]

            def unpack() -> None:
                for t, piece in zip(outputs, torch.split(got, splits_out), strict=True):
                    t.copy_(piece.view(t.shape))

            work = _AfterWork(self.inner.alltoall_base(got, sent, splits_out,
                                                       [t.numel() for t in inputs],
                                                       dist.AllToAllOptions()), unpack)
        return self._wrap(work, outputs, chunks=outputs)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_splits: list[int], input_splits: list[int],
                          opts: Any = None) -> Any:
        work = self._issue(self.inner.alltoall_base, output, input, output_splits, input_splits,
                     opts=opts)
        if output_splits:
            chunks = list(torch.split(output, list(output_splits))) if output.numel() else []
            chunks = [c for c in chunks if c.numel()]
            if len(chunks) >= 2 and chunks[0].shape != chunks[1].shape:
                chunks = []
        else:
            chunks = _chunks(output, self.size())
        return self._wrap(work, [output], chunks=chunks)

    # -- synchronisation and point to point --------------------------------------------------
    def _get_backend(self, device: Any) -> Any:
        """torch 2.15's batch_isend_irecv asks whether the group's backend coalesces: answer
        with the wrapped Gloo (the ops themselves still go through this group)."""
        return self.inner

    def barrier(self, opts: Any = None) -> Any:
        return self._issue(self.inner.barrier, opts=opts)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._wrap(self.inner.recv(tensors, src, tag), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._wrap(self.inner.recv_anysource(tensors, tag), tensors)

    # torch 2.4 calls these names (from Python); newer torch the ones above (from C++).
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> FaultyGloo:
    return FaultyGloo(store, rank, size, timeout)


dist.Backend.register_backend("faulty", _create, devices=["cpu"])
