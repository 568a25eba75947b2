"""The fault-injecting backend: Gloo behind a Python ``ProcessGroup``, registered as ``mutant``.

Imported like any third-party backend (``--backend-module harness.mutate.backend --backend
mutant``). ``COLLECTIVE_MUTANT`` (read in each rank when a process group is created) names the
fault from :data:`harness.mutate.faults.FAULTS`, or ``none`` for the faithful wrapper: every op
goes to a real ``ProcessGroupGloo`` and comes back untouched. Each fault changes one narrow
corner (see the catalogue for what each does); everything else stays faithful, so a fault
survives exactly when no case looks at its corner.

Output-side faults are applied when the Work is waited (the op has then finished), input-side
faults on copies (a rank's own input is never modified by a fault unless the op is in place).
The plumbing (every method of the ProcessGroup API, torch-version names, Work wrapping) is
:class:`harness.backends.wrapping.WrappingProcessGroup`'s; this module holds only the faults.
It leaves ``compose_missing`` off: the faithful wrapper keeps Gloo's own gaps on every torch.
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
from torch._C._distributed_c10d import AllgatherOptions

from ..backends.wrapping import Call, DoneWork, WrappedWork, WrappingProcessGroup, shares
from .faults import (
    BACKEND,
    BIG_WORLD,
    ENV,
    FAITHFUL,
    LARGE_BYTES,
    NAMES,
    ODD_WORLD_SIZE,
    SPLIT_ELEMENTS,
)

Hook = Callable[[], None]
FLIPPED_DTYPES = {"bf16_wrong_value": torch.bfloat16, "fp16_wrong_value": torch.float16,
                  "int8_wrong_value": torch.int8}
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
DATA_MOVEMENT = ("broadcast", "all_gather", "reduce_scatter", "all_to_all")


def flip(t: torch.Tensor, last: bool = False) -> None:
    """Flip the lowest bit of the first (or last) element of ``t``, whatever its dtype."""
    if not t.numel():
        return
    idx = tuple((s - 1) if last else 0 for s in t.shape)
    v = t[idx].reshape(1).clone()
    b = v.view(torch.uint8)
    b[0] = b[0] ^ 1
    t[idx] = v[0]


def write_past_end(t: torch.Tensor) -> None:
    """Write a copy of ``t``'s last element one element past its end, when its storage has
    room there (an off-by-one loop bound; memory the caller owns but the op does not)."""
    if not t.numel() or t.layout != torch.strided or any(st < 0 for st in t.stride()):
        return
    last = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride(),
                                                                 strict=True))
    size = t.element_size()
    if (last + 2) * size > t.untyped_storage().nbytes():
        return  # nothing after it in this allocation: the fault cannot show
    whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    whole[(last + 1) * size:(last + 2) * size] = whole[last * size:(last + 1) * size].clone()


def _swap(x: torch.Tensor, y: torch.Tensor) -> None:
    tmp = x.clone()
    x.copy_(y)
    y.copy_(tmp)


def _rotate(chunks: list[torch.Tensor]) -> None:
    """Every chunk moves one slot down (the last to the first): rank r's data lands at r + 1."""
    kept = [c.clone() for c in chunks]
    for k, c in enumerate(chunks):
        c.copy_(kept[k - 1])


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


class MutantGloo(WrappingProcessGroup):
    """Delegates every op to a real ProcessGroupGloo and applies the configured fault."""

    backend_name = BACKEND
    default_groups = 0  # default groups this process made (stale_rank_after_reform)

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(store, rank, size, timeout)
        self.fault = os.environ.get(ENV, FAITHFUL)
        if self.fault not in (FAITHFUL, *NAMES):
            raise ValueError(f"{ENV}={self.fault!r}: not a fault; choose one of "
                             f"{', '.join((FAITHFUL, *NAMES))}")
        # A group smaller than the default one (the default group does not exist yet while
        # it is being created).
        self.subgroup = dist.is_initialized() and size < dist.get_world_size()
        self.float_all_reduces = 0  # run_dependent_sum: calls so far on this group
        # stale_rank_after_reform: a default group made after another one in this process (a
        # world re-formed after a death) keeps the old world's rank order.
        self.reformed = not dist.is_initialized() and MutantGloo.default_groups > 0
        if not dist.is_initialized():
            MutantGloo.default_groups += 1
        self.seen: set[tuple[int, int]] = set()  # zeros_on_first_use: (address, bytes) used

    # -- input side ----------------------------------------------------------------------------
    def prepare(self, call: Call) -> None:
        f = self.fault
        if call.method in ("reduce_scatter", "reduce_scatter_single", "allgather",
                           "all_gather_single"):
            # Decided on what the caller passed, before any input is replaced.
            call.notes["inplace"] = any(shares(o, i) for o in call.outputs for i in call.inputs)
        if (f == "dropped_contribution" and call.op == "reduce_scatter"
                and self.rank() == self.size() - 1):
            call.inputs = [torch.zeros_like(t) for t in call.inputs]
        if (f == "bxor_as_bor" and call.op in ("all_reduce", "reduce", "reduce_scatter")
                and call.opts is not None and call.opts.reduceOp == dist.ReduceOp.BXOR):
            call.opts.reduceOp = dist.ReduceOp.BOR
        if f == "p2p_tags_ignored" and call.op in ("send", "recv"):
            call.tag = 0
        if f == "recv_unwritten" and call.op == "recv":
            # What the last element held before the receive was issued: taken after it, the
            # data had sometimes landed already, and the fault did not happen (a drill that
            # missed its first receive under load).
            call.notes["unwritten"] = [(t, t[tuple(s - 1 for s in t.shape)].clone())
                                       for t in call.outputs if t.numel()]

    def replace(self, call: Call) -> Any:
        f, opts = self.fault, call.opts
        if (f == "int_sum_saturates" and call.op == "all_reduce"
                and (opts is None or opts.reduceOp == dist.ReduceOp.SUM)
                and call.inputs[0].dtype in INT_DTYPES and call.inputs[0].numel()):
            return self._saturating_allreduce(call.inputs[0])
        if f == "coalesced_first_only" and call.op == "all_reduce_coalesced" \
                and len(call.inputs) > 1:
            first = self.inner.allreduce_coalesced(call.inputs[:1], *(() if opts is None
                                                                       else (opts,)))
            return WrappedWork(first)
        if f == "barrier_no_wait" and call.op == "barrier":
            return DoneWork()
        return None

    def _saturating_allreduce(self, t: torch.Tensor) -> Any:
        mine = t.detach().contiguous().clone()
        parts = [torch.empty_like(mine) for _ in range(self.size())]
        work = self.inner.allgather([parts], [mine], AllgatherOptions())

        def after() -> None:
            t.copy_(saturating_sum(parts))

        return WrappedWork(work, after, (), self._mode(False))

    # -- output side ---------------------------------------------------------------------------
    def finish(self, call: Call, work: Any) -> Any:
        if call.op in ("send", "recv"):
            return self._p2p(work, call.notes.get("unwritten", []), call.op == "recv")
        hooks = self._hooks(call.op, call.outputs, call.root, call.notes.get("inplace", False),
                            call.nbytes, call.chunks)

        def after() -> None:
            for h in hooks:
                h()

        mode = self._mode(p2p=False)
        if self.fault == "hang_above_size" and call.op == "broadcast" \
                and call.nbytes > LARGE_BYTES:
            mode = "hang"
        if self.fault == "survivor_wait_hangs":
            mode = "hang_on_error"
        if not hooks and not mode:
            return work  # faithful: Gloo's own Work
        return WrappedWork(work, after if hooks else None, (), mode)

    def _mode(self, p2p: bool) -> str:
        kind = "p2p" if p2p else "collective"
        for mode in ("early_complete", "early_wait"):
            if self.fault == f"{mode}_{kind}":
                return mode
        return ""

    def _hooks(self, op: str, outputs: list[torch.Tensor], root: int | None,
               inplace: bool, nbytes: int, chunks: list[torch.Tensor]) -> list[Hook]:
        """The output-side corruptions of this fault for one op call (run after the op)."""
        f, rank, size = self.fault, self.rank(), self.size()
        outs = [t for t in outputs if t.numel()]
        hooks: list[Hook] = self._numerics_hooks(op, outs) + self._integrity_hooks(op, outs)
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
        elif (f == "stale_rank_after_reform" and self.reformed and op in ("gather", "all_gather")
              and len(chunks) >= 2 and chunks[0].numel()
              and len({c.shape for c in chunks}) == 1):
            hooks.append(lambda: _rotate(chunks))
        return hooks

    def _numerics_hooks(self, op: str, outs: list[torch.Tensor]) -> list[Hook]:
        """The numerics faults: one ulp off where only a property can tell (issue 29)."""
        f = self.fault
        floats = [t for t in outs if t.is_floating_point()]
        if op == "all_reduce_coalesced" and f == "coalesced_ulp":
            return [lambda t=t: flip(t) for t in floats[:1]]
        if op != "all_reduce" or not floats:
            return []
        if f == "run_dependent_sum":
            self.float_all_reduces += 1
            if self.float_all_reduces % 2 == 0:
                return [lambda t=t: flip(t) for t in floats[:1]]
        if f == "last_rank_ulp" and self.rank() == self.size() - 1:
            return [lambda t=t: flip(t) for t in floats[:1]]
        if f == "misaligned_wrong":
            return [lambda t=t: flip(t) for t in floats[:1] if t.data_ptr() % 16]
        if f == "size_dependent_sum":
            return [lambda t=t: flip(t) for t in floats[:1] if t.numel() > SPLIT_ELEMENTS]
        return []

    def _integrity_hooks(self, op: str, outs: list[torch.Tensor]) -> list[Hook]:
        """The integrity faults (issue 42): outside the buffer, first use, big worlds."""
        f = self.fault
        if f == "writes_past_end":
            return [lambda t=t: write_past_end(t) for t in outs[-1:]]
        if f == "zeros_on_first_use":
            fresh = [t for t in outs if (t.data_ptr(), t.numel() * t.element_size())
                     not in self.seen]
            self.seen.update((t.data_ptr(), t.numel() * t.element_size()) for t in outs)
            return [lambda t=t: t.zero_() for t in fresh]
        if f == "wrong_above_8_ranks" and self.size() > BIG_WORLD:
            return [lambda t=t: flip(t) for t in outs[:1]]
        if f == "misaligned_data_movement" and op in DATA_MOVEMENT:
            return [lambda t=t: flip(t, last=True) for t in outs[-1:] if t.data_ptr() % 16]
        return []

    def _in_group_corner(self, op: str) -> bool:
        """The group-shape faults: a world of 3 ranks (all_reduce), or any subgroup."""
        if self.fault == "world_size_3_wrong":
            return op == "all_reduce" and self.size() == ODD_WORLD_SIZE and not self.subgroup
        return (self.fault == "subgroup_wrong" and op in ("all_reduce", "broadcast")
                and self.subgroup)

    def _p2p(self, work: Any, kept: list[tuple[torch.Tensor, torch.Tensor]],
             receive: bool) -> Any:
        mode = self._mode(p2p=True) or ("hang_on_error" if self.fault == "survivor_wait_hangs"
                                         else "")
        if mode == "early_wait" and not receive:
            mode = ""  # a send's buffer is free once handed over: only receives land late
        after: Hook | None = None
        if self.fault == "recv_unwritten" and receive:

            def after() -> None:
                for t, old in kept:
                    t[tuple(s - 1 for s in t.shape)] = old

        if after is None and not mode:
            return work
        return WrappedWork(work, after, (), mode)


MutantGloo.register()
