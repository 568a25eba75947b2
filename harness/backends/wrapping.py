"""A Python ``ProcessGroup`` that forwards every op to a real backend, for fault injection.

:class:`WrappingProcessGroup` implements the whole ProcessGroup API that ``torch.distributed``
calls on a backend (collectives in their list, single-tensor and coalesced forms, barrier,
point to point), forwards each call to ``self.inner`` (a ``ProcessGroupGloo`` unless
:meth:`WrappingProcessGroup.make_inner` says otherwise) and lets a subclass change it at three
points, each given the call as a :class:`Call`:

- :meth:`~WrappingProcessGroup.prepare` before the op is issued (replace what this rank
  contributes, change the options or the tag);
- :meth:`~WrappingProcessGroup.replace` instead of issuing it (return a Work of your own);
- :meth:`~WrappingProcessGroup.finish` with the inner Work (return a :class:`WrappedWork`
  whose ``after`` hook changes the outputs once the op finished, or whose ``mode`` breaks the
  completion semantics).

The plumbing that every such wrapper otherwise re-implements lives here once:

- torch 2.4 calls a Python ProcessGroup's methods from Python, some without options and under
  older names (``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``,
  ``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``); newer torch calls
  them from C++ with options. Every method takes optional options and both names exist.
- torch 2.15's ``batch_isend_irecv`` asks the group for its backend (``_get_backend``), which a
  Python ProcessGroup does not have: the group answers with the backend it wraps, which does
  not coalesce, so point-to-point ops still run one by one through the wrapper.
- With ``compose_missing = True`` the ops torch 2.4's Gloo lacks are built from others, so the
  wrapped backend offers the whole API on every torch version: the list ``reduce_scatter`` and
  list ``alltoall`` ("does not support"), and ``reduce_scatter_tensor`` with a reduce op other
  than SUM (which torch 2.4's Gloo silently sums). A wrapper that must stay faithful to the
  backend's own gaps (the mutation backend) leaves it False.

Register a subclass with ``MyWrapper.register()`` (its ``backend_name`` on CPU) in a module
given to ``--backend-module``.
"""

# mypy: disable-error-code="override,call-arg,misc,assignment"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

Hook = Callable[[], None]
MODES = ("", "early_wait", "early_complete", "hang", "hang_on_error")
# torch 2.4's Gloo reduce_scatter_tensor ignores the reduce op and returns the SUM (observed on
# torch 2.4.1, see cases/reduce_scatter.yaml).
RS_TENSOR_SUMS = tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5)


class WrappedWork(dist.Work):
    """Delegates to the inner Work (and waits ``more`` first); runs ``after`` once, when waited.

    ``mode`` breaks the completion semantics: ``early_complete`` (``is_completed()`` is True from
    the start), ``early_wait`` (``wait()`` returns at once, before the op finished), ``hang``
    (``wait()`` never returns; the harness declares the hang at its deadline),
    ``hang_on_error`` (where the inner ``wait()`` raises, it never returns instead).
    """

    def __init__(self, inner: Any, after: Hook | None = None, more: Sequence[Any] = (),
                 mode: str = "") -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"WrappedWork mode {mode!r}: choose one of {MODES}")
        self.inner, self.after, self.more, self.mode = inner, after, list(more), mode
        self.done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self.mode == "hang":
            while True:
                time.sleep(1.0)
        if self.mode == "hang_on_error":
            try:
                return self._wait(timeout)
            except Exception:  # a survivor that never learns its peer died
                while True:
                    time.sleep(1.0)
        return self._wait(timeout)

    def _wait(self, timeout: timedelta | None) -> bool:
        if self.mode == "early_wait":
            return True
        for w in self.more:
            w.wait()
        ok = bool(self.inner.wait()) if timeout is None else bool(self.inner.wait(timeout))
        if not self.done:
            self.done = True
            if self.after is not None:
                self.after()
        return ok

    def is_completed(self) -> bool:
        if self.mode == "early_complete":
            return True
        if self.mode == "hang":
            return False
        done = bool(self.inner.is_completed()) and all(bool(w.is_completed()) for w in self.more)
        return done and (self.after is None or self.done)

    def is_success(self) -> bool:
        return bool(self.inner.is_success())

    def exception(self) -> Any:
        return self.inner.exception()

    def get_future(self) -> Any:
        return self.inner.get_future()

    def _source_rank(self) -> int:
        return int(self.inner._source_rank())


class DoneWork(dist.Work):
    """A Work that is complete from the start (e.g. a barrier that does not wait)."""

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> Any:
        fut: torch.futures.Future[Any] = torch.futures.Future()
        fut.set_result([])
        return fut


@dataclass
class Call:
    """One op call as the hooks see it.

    ``op`` is the family (all_reduce, all_reduce_coalesced, reduce, reduce_scatter, broadcast,
    scatter, gather, all_gather, all_gather_coalesced, all_to_all, barrier, send, recv);
    ``method`` the ProcessGroup method torch called under its current name (``allgather``,
    ``all_gather_single``, ...). ``inputs`` are the tensors this rank contributes, flat: the op
    is issued with ``inputs`` as :meth:`WrappingProcessGroup.prepare` leaves them (for in-place
    ops they are the outputs too). ``chunks`` are the output's per-rank pieces where the op has
    them (gathers, all-to-alls). ``notes`` carries a subclass's state from prepare to finish.
    """

    op: str
    method: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    opts: Any = None
    root: int | None = None
    peer: int | None = None
    tag: int = 0
    chunks: list[torch.Tensor] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the outputs."""
        return sum(t.numel() * t.element_size() for t in self.outputs)


def call_inner(fn: Callable[..., Any], *args: Any, opts: Any = None) -> Any:
    """Call an inner backend method with the caller's options, or with its defaults when the
    caller (torch 2.4 calling from Python) passed none."""
    return fn(*args) if opts is None else fn(*args, opts)


def shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two non-empty tensors share storage (an out-of-place op called in place)."""
    return bool(a.numel() and b.numel()
                and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def even_chunks(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``t`` split along dim 0 into ``n`` equal views (empty when it does not divide)."""
    if n < 2 or t.dim() == 0 or t.shape[0] % n:
        return []
    return list(t.chunk(n)) if t.shape[0] else []


def _lacks(exc: RuntimeError) -> bool:
    return "does not support" in str(exc)


def _root(opts: Any) -> int:
    return int(opts.rootRank) if opts is not None else 0


class WrappingProcessGroup(dist.ProcessGroup):
    """Forwards every op to ``self.inner``; subclasses change calls through three hooks."""

    backend_name: ClassVar[str] = "wrapped"
    compose_missing: ClassVar[bool] = False

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.inner: Any = self.make_inner(store, rank, size, timeout)

    def make_inner(self, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
        """The backend the calls go to (override to wrap another backend than Gloo)."""
        return ProcessGroupGloo(store, rank, size, timeout)

    @classmethod
    def register(cls, devices: Sequence[str] = ("cpu",)) -> None:
        """Register this class with torch.distributed under ``backend_name``."""
        def create(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
            return cls(store, rank, size, timeout)

        dist.Backend.register_backend(cls.backend_name, create, devices=list(devices))

    def getBackendName(self) -> str:
        return self.backend_name

    def set_timeout(self, timeout: timedelta) -> None:
        """The wrapped backend's timeout (torch's ProcessGroup.set_timeout reaches a Python
        group here only: without this the call would change nothing)."""
        self.inner.set_timeout(timeout)

    def _get_backend(self, device: Any) -> Any:
        return self.inner

    # -- the hooks -------------------------------------------------------------------------------
    def prepare(self, call: Call) -> None:
        """Before the op is issued: change ``call.inputs``, ``call.opts`` or ``call.tag``."""

    def replace(self, call: Call) -> Any:
        """A Work to return instead of issuing the op, or None to issue it."""
        return None

    def finish(self, call: Call, work: Any) -> Any:
        """The Work the caller gets, given the inner one (faithful: the inner one)."""
        return work

    def _run(self, call: Call, issue: Callable[[Call], Any]) -> Any:
        self.prepare(call)
        work = self.replace(call)
        if work is not None:
            return work
        return self.finish(call, issue(call))

    # -- reductions ------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        call = Call("all_reduce", "allreduce", tensors, tensors, opts)
        return self._run(call, lambda c: call_inner(self.inner.allreduce, c.inputs, opts=c.opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        call = Call("all_reduce_coalesced", "allreduce_coalesced", tensors, tensors, opts)
        return self._run(call, lambda c: call_inner(self.inner.allreduce_coalesced, c.inputs,
                                                    opts=c.opts))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        call = Call("reduce", "reduce", tensors, tensors, opts, root=_root(opts))
        return self._run(call, lambda c: call_inner(self.inner.reduce, c.inputs, opts=c.opts))

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        call = Call("reduce_scatter", "reduce_scatter", [t for lst in inputs for t in lst],
                    outputs, opts)
        return self._run(call, lambda c: self._reduce_scatter(c, [len(x) for x in inputs]))

    def _reduce_scatter(self, c: Call, lengths: list[int]) -> Any:
        nested, at = [], 0
        for n in lengths:
            nested.append(c.inputs[at:at + n])
            at += n
        try:
            return call_inner(self.inner.reduce_scatter, c.outputs, nested, opts=c.opts)
        except RuntimeError as exc:
            if not (self.compose_missing and _lacks(exc)):
                raise
        # All-reduce the stacked list, keep this rank's entry: every reduce op works.
        stacked = torch.stack(nested[0])
        ar = dist.AllreduceOptions()
        ar.reduceOp = c.opts.reduceOp if c.opts is not None else dist.ReduceOp.SUM
        out, mine = c.outputs[0], stacked[self.rank()]

        def keep_mine() -> None:
            out.copy_(mine)

        return WrappedWork(self.inner.allreduce([stacked], ar), keep_mine)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Any:
        call = Call("reduce_scatter", "reduce_scatter_single", [input], [output], opts)
        return self._run(call, self._reduce_scatter_single)

    def _reduce_scatter_single(self, c: Call) -> Any:
        (output,), (src,) = c.outputs, c.inputs
        if (self.compose_missing and RS_TENSOR_SUMS and c.opts is not None
                and c.opts.reduceOp != dist.ReduceOp.SUM):
            # torch 2.4's Gloo would return the SUM: all-reduce a copy, keep this rank's chunk.
            whole = src.clone()
            ar = dist.AllreduceOptions()
            ar.reduceOp = c.opts.reduceOp
            mine = whole.reshape(self.size(), -1)[self.rank()]

            def keep_mine() -> None:
                output.copy_(mine.reshape(output.shape))

            return WrappedWork(self.inner.allreduce([whole], ar), keep_mine)
        return call_inner(self.inner._reduce_scatter_base, output, src, opts=c.opts)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self.reduce_scatter_single(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return WrappedWork(works[-1], None, works[:-1])

    # -- one to all / all to one -----------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        call = Call("broadcast", "broadcast", tensors, tensors, opts, root=_root(opts))
        return self._run(call, lambda c: call_inner(self.inner.broadcast, c.inputs, opts=c.opts))

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        call = Call("scatter", "scatter", list(inputs[0]) if inputs else [], outputs, opts,
                    root=_root(opts))
        return self._run(call, lambda c: call_inner(
            self.inner.scatter, c.outputs, [c.inputs] if inputs else inputs, opts=c.opts))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> Any:
        flat = list(outputs[0]) if outputs else []
        call = Call("gather", "gather", list(inputs), flat, opts, root=_root(opts), chunks=flat)
        return self._run(call, lambda c: call_inner(self.inner.gather, outputs, c.inputs,
                                                    opts=c.opts))

    # -- gathers and all-to-alls -----------------------------------------------------------------
    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Any:
        flat = list(outputs[0])
        call = Call("all_gather", "allgather", list(inputs), flat, opts, chunks=flat)
        return self._run(call, lambda c: call_inner(self.inner.allgather, outputs, c.inputs,
                                                    opts=c.opts))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Any:
        call = Call("all_gather", "all_gather_single", [input], [output], opts,
                    chunks=even_chunks(output, self.size()))
        return self._run(call, lambda c: call_inner(self.inner._allgather_base, output,
                                                    c.inputs[0], opts=c.opts))

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Any:
        works = [self.all_gather_single(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return WrappedWork(works[-1], None, works[:-1])

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> Any:
        # outputs[r] holds rank r's tensors: their first entries are per-rank pieces.
        call = Call("all_gather_coalesced", "allgather_coalesced", list(inputs),
                    [t for lst in outputs for t in lst], opts,
                    chunks=[lst[0] for lst in outputs] if len(outputs) >= 2 else [])
        return self._run(call, lambda c: call_inner(self.inner.allgather_coalesced, outputs,
                                                    c.inputs, opts=c.opts))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> Any:
        call = Call("all_to_all", "alltoall", list(inputs), list(outputs), opts,
                    chunks=list(outputs))
        return self._run(call, self._alltoall)

    def _alltoall(self, c: Call) -> Any:
        try:
            return call_inner(self.inner.alltoall, c.outputs, c.inputs, opts=c.opts)
        except RuntimeError as exc:
            if not (self.compose_missing and _lacks(exc)):
                raise
        # One flat all_to_all_single with per-peer element counts, copied back after.
        sent = torch.cat([t.reshape(-1) for t in c.inputs])
        got = sent.new_empty(sum(t.numel() for t in c.outputs))
        splits_out = [t.numel() for t in c.outputs]
        outputs = c.outputs

        def unpack() -> None:
            for t, piece in zip(outputs, torch.split(got, splits_out), strict=True):
                t.copy_(piece.view(t.shape))

        return WrappedWork(self.inner.alltoall_base(got, sent, splits_out,
                                                    [t.numel() for t in c.inputs],
                                                    dist.AllToAllOptions()), unpack)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_splits: list[int], input_splits: list[int],
                          opts: Any = None) -> Any:
        if output_splits:
            chunks = list(torch.split(output, list(output_splits))) if output.numel() else []
            chunks = [c for c in chunks if c.numel()]
            if len(chunks) >= 2 and chunks[0].shape != chunks[1].shape:
                chunks = []
        else:
            chunks = even_chunks(output, self.size())
        call = Call("all_to_all", "all_to_all_single", [input], [output], opts, chunks=chunks)
        return self._run(call, lambda c: call_inner(
            self.inner.alltoall_base, output, c.inputs[0], output_splits, input_splits,
            opts=c.opts))

    # -- synchronisation and point to point ------------------------------------------------------
    def barrier(self, opts: Any = None) -> Any:
        call = Call("barrier", "barrier", [], [], opts)
        return self._run(call, lambda c: call_inner(self.inner.barrier, opts=c.opts))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        call = Call("send", "send", list(tensors), [], peer=dst, tag=tag)
        return self._run(call, lambda c: self.inner.send(c.inputs, dst, c.tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        call = Call("recv", "recv", [], tensors, peer=src, tag=tag)
        return self._run(call, lambda c: self.inner.recv(tensors, src, c.tag))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        call = Call("recv", "recv_anysource", [], tensors, tag=tag)
        return self._run(call, lambda c: self.inner.recv_anysource(tensors, c.tag))

    # torch 2.4 calls these names (from Python); newer torch the ones above (from C++).
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single
