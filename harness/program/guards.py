"""Guard regions: every tensor buffer the harness allocates sits inside a larger allocation.

The bytes before the buffer's first byte and after its last one (``guard:`` bytes on each
side, plus the gap an ``offset:`` leaves before the start) are filled with :data:`PATTERN`.
They are read after each op returns and after each ``wait()``: a backend that writes past
the end of an output, or before its start, changes them, which a value check inside the
buffer can never see (nccl-tests and torchcomms check the same way). Runs in rank
processes (imports torch).

Not guarded, each for its reason: object buffers (pickled Python values: the backend never
writes into memory the harness allocated), sparse tensors (a sparse result is a tensor the
backend allocates), and the entries of one list buffer among themselves (they are
consecutive views of one flat allocation, so a write past entry ``j`` lands in entry
``j + 1``, where the value check sees it unless the op overwrites it later).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from ..model import TensorCheck

PATTERN = 0xDB  # neither the 0xA5 poison, nor 0, nor a NaN's byte: a write shows up


@dataclass
class Region:
    """One guarded buffer: its allocation (bytes) and where the buffer lies inside it."""

    name: str
    base: torch.Tensor  # uint8, the whole allocation
    start: int  # offset of the buffer's first byte in ``base``
    end: int  # one past its last byte


def _span(t: torch.Tensor) -> tuple[int, int]:
    """First and one-past-last element of ``t`` in its storage (non-negative strides)."""
    lo = int(t.storage_offset())
    if not t.numel():
        return lo, lo
    return lo, lo + sum((int(s) - 1) * int(st) for s, st in zip(t.shape, t.stride(),
                                                                 strict=True)) + 1


def wrap(name: str, t: torch.Tensor, g: int, reuse: Region | None = None
         ) -> tuple[torch.Tensor, Region | None]:
    """``t``'s values in a view of the same shape, strides and start alignment, inside an
    allocation with ``g`` guard bytes on each side (a multiple of 64:
    :meth:`~harness.model.TensorSpec.guard_bytes`); ``t`` itself when ``g`` is 0 or the
    tensor is not a plain strided one. ``reuse``: an earlier run's allocation of the same
    buffer, refilled in place when it has the same layout (a later iteration then writes
    into the very memory the first one used, as nccl-tests' ``-c`` does)."""
    if not g or t.layout != torch.strided or any(st < 0 for st in t.stride()):
        return t, None
    size = t.element_size()
    lo, hi = _span(t)
    pre = g + lo * size  # the gap an offset leaves before the start is guarded too
    total = pre + (hi - lo) * size + g
    same = (reuse is not None and reuse.start == pre and reuse.end == pre + (hi - lo) * size
            and reuse.base.numel() == total and reuse.base.device == t.device)
    base = reuse.base if same and reuse is not None else torch.empty(
        total, dtype=torch.uint8, device=t.device)
    end = pre + (hi - lo) * size
    base[:pre].fill_(PATTERN)  # only the guards: the buffer's own bytes are copied below
    base[end:].fill_(PATTERN)
    typed = base.view(torch.uint8 if t.dtype == torch.bool else t.dtype)
    view = typed.as_strided(tuple(t.shape), tuple(t.stride()), pre // size)
    if t.dtype == torch.bool:  # copy the bytes: bool copies canonicalise them
        view.copy_(t.view(torch.uint8))
        view = view.view(torch.bool)
    else:
        view.copy_(t)
    return view, Region(name, base, pre, end)


@dataclass
class Watch:
    """The guarded buffers of one run and what was found in their guards (once per side)."""

    regions: dict[str, Region] = field(default_factory=dict)
    found: dict[tuple[str, str], TensorCheck] = field(default_factory=dict)

    def check(self, names: Iterable[str], what: str, when: str) -> None:
        """Read the guards of ``names`` (``what``: the op and step; ``when``: after the call
        returned, or after wait())."""
        for name in names:
            region = self.regions.get(name)
            if region is None:
                continue
            for side, part in (("before the start", region.base[:region.start]),
                               ("past the end", region.base[region.end:])):
                if (name, side) in self.found or bool((part == PATTERN).all()):
                    continue
                changed = (part != PATTERN).nonzero().flatten()
                if not changed.numel():
                    continue
                far = (int(changed[-1]) + 1 if side == "past the end"
                       else part.numel() - int(changed[0]))
                self.found[(name, side)] = TensorCheck(
                    tensor=name, ok=False, expectation="guard", wrong=int(changed.numel()),
                    total=part.numel(),
                    note=(f"{what} wrote {changed.numel()} byte(s) {side} of buffer "
                          f"{name!r} (reaching {far} byte(s) {side.split()[0]} it, in a "
                          f"{part.numel()}-byte guard), seen {when}"))

    def checks(self) -> list[TensorCheck]:
        """One failed check per buffer side whose guard was written."""
        return list(self.found.values())
