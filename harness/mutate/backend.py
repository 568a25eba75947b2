"""The fault-injecting backend: Gloo behind a Python ``ProcessGroup``, registered as ``mutant``.

Imported like any third-party backend (``--backend-module harness.mutate.backend --backend
mutant``). ``COLLECTIVE_MUTANT`` (read in each rank when a process group is created) names the
fault from :data:`harness.mutate.faults.FAULTS`, or ``none`` for the faithful wrapper: every op
goes to a real ``ProcessGroupGloo`` and comes back untouched. Each fault changes one narrow
corner (see the catalogue for what each does); everything else stays faithful, so a fault
survives exactly when no case looks at its corner.

Output-side faults are applied when the Work is waited (the op has then finished), input-side
faults on copies (a rank's own input is never modified by a fault unless the op is in place).
"""

# mypy: disable-error-code="override,call-arg,misc"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, ProcessGroupGloo

from .faults import BACKEND, ENV, FAITHFUL, LARGE_BYTES, NAMES, ODD_WORLD_SIZE

Hook = Callable[[], None]
FLIPPED_DTYPES = {"bf16_wrong_value": torch.bfloat16, "fp16_wrong_value": torch.float16,
                  "int8_wrong_value": torch.int8}
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class _Work(dist.Work):
    """Delegates to Gloo's Work(s); runs ``after`` once they finished (at ``wait()``).

    ``mode`` breaks the completion semantics: ``early_complete`` (``is_completed()`` is True
    from the start), ``early_wait`` (``wait()`` returns at once), ``hang`` (``wait()`` never
    returns).
    """

    def __init__(self, inner: Any, after: Hook | None = None, more: Sequence[Any] = (),
                 mode: str = "") -> None:
        super().__init__()
        self.inner, self.after, self.more, self.mode = inner, after, list(more), mode
        self.done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self.mode == "hang":
            while True:  # the harness declares the hang at its deadline and ends the rank
                time.sleep(1.0)
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


class _Done(dist.Work):
    """A Work that is complete from the start (what a barrier that does not wait returns)."""

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


def flip(t: torch.Tensor, last: bool = False) -> None:
    """Flip the lowest bit of the first (or last) element of ``t``, whatever its dtype."""
    if not t.numel():
        return
    idx = tuple((s - 1) if last else 0 for s in t.shape)
    v = t[idx].reshape(1).clone()
    b = v.view(torch.uint8)
    b[0] = b[0] ^ 1
    t[idx] = v[0]


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.numel() and b.numel()
                and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _swap(x: torch.Tensor, y: torch.Tensor) -> None:
    tmp = x.clone()
    x.copy_(y)
    y.copy_(tmp)


def saturating_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Sum in rank order, clamping every partial sum at the dtype's limits."""
    info = torch.iinfo(parts[0].dtype)
    acc = parts[0].clone()
    for p in parts[1:]:
        if parts[0].dtype == torch.int64:
            s = acc + p  # wraps; overflow shows as a sign change
            s = torch.where((acc > 0) & (p > 0) & (s < 0), torch.full_like(s, info.max), s)
            s = torch.where((acc < 0) & (p < 0) & (s >= 0), torch.full_like(s, info.min), s)
            acc = s
        else:
            wide = acc.to(torch.int64) + p.to(torch.int64)
            acc = wide.clamp(info.min, info.max).to(parts[0].dtype)
    return acc


class MutantGloo(dist.ProcessGroup):
    """Delegates every op to a real ProcessGroupGloo and applies the configured fault."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.inner: Any = ProcessGroupGloo(store, rank, size, timeout)
        self.fault = os.environ.get(ENV, FAITHFUL)
        if self.fault not in (FAITHFUL, *NAMES):
            raise ValueError(f"{ENV}={self.fault!r}: not a fault; choose one of "
                             f"{', '.join((FAITHFUL, *NAMES))}")
        # A group smaller than the default one (the default group does not exist yet while
        # it is being created).
        self.subgroup = dist.is_initialized() and size < dist.get_world_size()

    def getBackendName(self) -> str:
        return BACKEND

    # -- fault plumbing ------------------------------------------------------------------
    def _mode(self, p2p: bool) -> str:
        kind = "p2p" if p2p else "collective"
        for mode in ("early_complete", "early_wait"):
            if self.fault == f"{mode}_{kind}":
                return mode
        return ""

    def _hooks(self, op: str, outputs: Sequence[torch.Tensor], root: int | None = None,
               inplace: bool = False, nbytes: int = 0,
               chunks: Sequence[torch.Tensor] = ()) -> list[Hook]:
        """The output-side corruptions of this fault for one op call (run after the op)."""
        f, rank, size = self.fault, self.rank(), self.size()
        outs = [t for t in outputs if t.numel()]
        hooks: list[Hook] = []
        if f in FLIPPED_DTYPES:
            hooks += [lambda t=t: flip(t) for t in outs if t.dtype == FLIPPED_DTYPES[f]]
        elif f == "large_all_reduce_wrong" and op == "all_reduce" and nbytes > LARGE_BYTES:
            hooks += [lambda t=t: flip(t, last=True) for t in outs[:1]]
        elif self._in_group_corner(op):
            hooks += [lambda t=t: flip(t) for t in outs[:1]]
        elif f == "inplace_wrong" and inplace:
            hooks += [lambda t=t: flip(t, last=True) for t in outs[-1:]]
        elif f == "nonzero_root_wrong" and root not in (None, 0):
            receives = {"broadcast": rank != root, "reduce": rank == root,
                        "gather": rank == root, "scatter": True}.get(op, False)
            if receives:
                hooks += [lambda t=t: flip(t) for t in outs[:1]]
        elif f == "complex_conjugated" and op in ("all_reduce", "reduce"):
            hooks += [lambda t=t: t.copy_(t.conj()) for t in outs if t.is_complex()]
        elif (f == "gather_order_ws4" and op in ("gather", "all_gather") and size >= 4
              and len(chunks) >= 3 and chunks[1].numel()):
            hooks.append(lambda: _swap(chunks[1], chunks[2]))
        return hooks

    def _in_group_corner(self, op: str) -> bool:
        """The group-shape faults: a world of 3 ranks (all_reduce), or any subgroup."""
        if self.fault == "world_size_3_wrong":
            return op == "all_reduce" and self.size() == ODD_WORLD_SIZE and not self.subgroup
        return (self.fault == "subgroup_wrong" and op in ("all_reduce", "broadcast")
                and self.subgroup)

    def _wrap(self, work: Any, op: str, outputs: Sequence[torch.Tensor], *,
              root: int | None = None, inplace: bool = False, nbytes: int = 0,
              chunks: Sequence[torch.Tensor] = (), more: Sequence[Any] = (),
              extra: Sequence[Hook] = ()) -> Any:
        hooks = [*self._hooks(op, outputs, root, inplace, nbytes, chunks), *extra]

        def after() -> None:
            for h in hooks:
                h()

        mode = self._mode(p2p=False)
        if self.fault == "hang_above_size" and op == "broadcast" and nbytes > LARGE_BYTES:
            mode = "hang"
        if not hooks and not mode and not more:
            return work  # faithful: Gloo's own Work
        return _Work(work, after if hooks else None, more, mode)

    def _reduce_opts(self, opts: Any) -> Any:
        if self.fault == "bxor_as_bor" and opts.reduceOp == dist.ReduceOp.BXOR:
            opts.reduceOp = dist.ReduceOp.BOR
        return opts

    # -- reductions --------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        t = tensors[0]
        if (self.fault == "int_sum_saturates" and opts.reduceOp == dist.ReduceOp.SUM
                and t.dtype in INT_DTYPES and t.numel()):
            return self._saturating_allreduce(t)
        work = self.inner.allreduce(tensors, self._reduce_opts(opts))
        return self._wrap(work, "all_reduce", tensors, nbytes=_nbytes(tensors))

    def _saturating_allreduce(self, t: torch.Tensor) -> Any:
        mine = t.detach().contiguous().clone()
        parts = [torch.empty_like(mine) for _ in range(self.size())]
        work = self.inner.allgather([parts], [mine], AllgatherOptions())

        def after() -> None:
            t.copy_(saturating_sum(parts))

        return _Work(work, after, (), self._mode(False))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        if self.fault == "coalesced_first_only" and len(tensors) > 1:
            return _Work(self.inner.allreduce_coalesced(tensors[:1], opts))
        work = self.inner.allreduce_coalesced(tensors, opts)
        return self._wrap(work, "all_reduce_coalesced", tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        work = self.inner.reduce(tensors, self._reduce_opts(opts))
        return self._wrap(work, "reduce", tensors, root=opts.rootRank)

    def _drop(self, t: torch.Tensor) -> torch.Tensor:
        if self.fault == "dropped_contribution" and self.rank() == self.size() - 1:
            return torch.zeros_like(t)
        return t

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any) -> Any:
        inplace = any(_shares(o, i) for o in outputs for lst in inputs for i in lst)
        inputs = [[self._drop(t) for t in lst] for lst in inputs]
        work = self.inner.reduce_scatter(outputs, inputs, self._reduce_opts(opts))
        return self._wrap(work, "reduce_scatter", outputs, inplace=inplace)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any) -> Any:
        work = self.inner._reduce_scatter_base(output, self._drop(input),
                                               self._reduce_opts(opts))
        return self._wrap(work, "reduce_scatter", [output], inplace=_shares(output, input))

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any) -> Any:
        works = [self.reduce_scatter_single(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return _Work(works[-1], None, works[:-1])

    # -- one to all / all to one -----------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        work = self.inner.broadcast(tensors, opts)
        return self._wrap(work, "broadcast", tensors, root=opts.rootRank,
                          nbytes=_nbytes(tensors))

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any) -> Any:
        work = self.inner.scatter(outputs, inputs, opts)
        return self._wrap(work, "scatter", outputs, root=opts.rootRank)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any) -> Any:
        flat = outputs[0] if outputs else []
        work = self.inner.gather(outputs, inputs, opts)
        return self._wrap(work, "gather", flat, root=opts.rootRank, chunks=flat)

    # -- gathers and all-to-alls -----------------------------------------------------------
    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any) -> Any:
        flat = outputs[0]
        inplace = any(_shares(o, i) for o in flat for i in inputs)
        work = self.inner.allgather(outputs, inputs, opts)
        return self._wrap(work, "all_gather", flat, inplace=inplace, chunks=flat)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        work = self.inner._allgather_base(output, input, opts)
        n = self.size()
        chunks = list(output.chunk(n)) if output.dim() and output.shape[0] % n == 0 else []
        return self._wrap(work, "all_gather", [output], inplace=_shares(output, input),
                          chunks=chunks)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any) -> Any:
        works = [self.all_gather_single(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return _Work(works[-1], None, works[:-1])

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any) -> Any:
        work = self.inner.allgather_coalesced(outputs, inputs, opts)
        return self._wrap(work, "all_gather_coalesced", [t for lst in outputs for t in lst])

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any) -> Any:
        return self._wrap(self.inner.alltoall(outputs, inputs, opts), "all_to_all", outputs)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_splits: list[int], input_splits: list[int], opts: Any) -> Any:
        work = self.inner.alltoall_base(output, input, output_splits, input_splits, opts)
        return self._wrap(work, "all_to_all", [output])

    # -- synchronisation and point to point --------------------------------------------------
    def barrier(self, opts: Any) -> Any:
        if self.fault == "barrier_no_wait":
            return _Done()
        return self._wrap(self.inner.barrier(opts), "barrier", [])

    def _tag(self, tag: int) -> int:
        return 0 if self.fault == "p2p_tags_ignored" else tag

    def _p2p(self, work: Any, tensors: list[torch.Tensor], receive: bool) -> Any:
        mode = self._mode(p2p=True)
        if mode == "early_wait" and not receive:
            mode = ""  # a send's buffer is free once handed over: only receives land late
        after: Hook | None = None
        if self.fault == "recv_unwritten" and receive:
            kept = [(t, t[tuple(s - 1 for s in t.shape)].clone()) for t in tensors if t.numel()]

            def after() -> None:
                for t, old in kept:
                    t[tuple(s - 1 for s in t.shape)] = old

        if after is None and not mode:
            return work
        return _Work(work, after, (), mode)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._p2p(self.inner.send(tensors, dst, self._tag(tag)), tensors, False)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._p2p(self.inner.recv(tensors, src, self._tag(tag)), tensors, True)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._p2p(self.inner.recv_anysource(tensors, self._tag(tag)), tensors, True)


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> MutantGloo:
    return MutantGloo(store, rank, size, timeout)


dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
