"""Per-chunk digests of a tensor: the definitions, computed here by torch ops on the tensor's
own device.

This module is the reference: the guard's C++ kernel (``harness/record/native/digest.cpp``)
takes the same digests of dense CPU tensors with fused loops, and agrees with these bit for bit
(tests/test_guard_digest.py, every dtype); these run for the rest (CUDA, non-contiguous or
complex tensors, the Python kernel).

Two kinds, both a few numbers per chunk of ``chunk`` elements (the tensor taken flat):

* exact: the chunk's bits as 32-, 16- or 8-bit words, zero-extended to 64 bits, summed three
  ways modulo 2^64: plainly, weighted by position (1, 2, ...) and weighted by odd 32-bit hashed
  weights. Any change of one word changes the sum (an odd weight times a non-zero difference
  below 2^32 is never 0 mod 2^64), and a swap of two words with different weights does too; it
  is a check against corruption, not a hash against an adversary.
* linear: ``sum_j w_j x_j`` and ``sum_j w_j |x_j|`` in float64 with small integer weights
  ``w_j = 1 + j mod 16``, or for integer dtypes ``sum_j w_j x_j`` in int64, wrapping. A SUM
  reduction's output checksum is then the sum of the inputs' checksums, up to rounding that
  :mod:`harness.guard.check` bounds. The float64 order is defined, so that the C++ loops can
  match it: element j goes to lane ``j mod 16``, each lane is summed in element order from 0,
  and the result is ``sum_l (l + 1) * S_l`` taken in lane order (on CUDA, where ``cumsum`` is a
  parallel scan, the order differs; only the bound matters there).

Nothing is copied to the host here: the results stay on the device, and :func:`to_host` starts
their (small) copy without waiting for it (CUDA: a non-blocking copy into pinned memory and an
event the checker thread waits on; no device-wide sync). The transient widened words of one
call are the only extra memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

WEIGHT_PERIOD = 16
MAX_CHUNKS = 1024  # per tensor: past this the chunks grow so the digest message stays small
_WEIGHTS: dict[tuple[str, int, torch.dtype, bool], torch.Tensor] = {}


def chunk_len(numel: int, chunk: int) -> int:
    """The chunk length used for a tensor of ``numel`` elements (``chunk`` unless that would
    give more than MAX_CHUNKS chunks)."""
    return max(chunk, -(-numel // MAX_CHUNKS), 1)


def _weights(n: int, device: torch.device, dtype: torch.dtype, exact: bool) -> torch.Tensor:
    key = (str(device), n, dtype, exact)  # both kinds have int64 weights: keyed apart
    got = _WEIGHTS.get(key)
    if got is None:
        j = torch.arange(n, dtype=torch.int64, device=device)
        # Odd 32-bit weights for the exact digest (coprime to 2^64; 32 bits so that a word
        # times its weight fits 64 bits, which the C++ loop's vector multiply needs), small
        # integers for the linear one (exact in float64: the bound in check.py needs no
        # weight rounding).
        w = (((j * 2654435761 + 0x9E3779B1) | 1) & 0xFFFFFFFF if exact
             else 1 + j % WEIGHT_PERIOD)
        got = _WEIGHTS[key] = w.to(dtype)
        if len(_WEIGHTS) > 256:
            _WEIGHTS.clear()
            _WEIGHTS[key] = got
    return got


def _rows(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The flat tensor as a (chunks, n) view and its shorter tail (if any)."""
    full = flat.numel() // n
    parts = []
    if full:
        parts.append(flat[: full * n].view(full, n))
    if flat.numel() - full * n:
        parts.append(flat[full * n:].view(1, -1))
    return parts


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as words zero-extended to int64 (32-bit where they divide evenly)."""
    flat = t.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    b = flat.view(torch.uint8)
    size = flat.element_size()
    if size >= 4:
        return b.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    if size == 2:
        return b.view(torch.int16).to(torch.int64) & 0xFFFF
    return b.to(torch.int64)


def exact(t: torch.Tensor, chunk: int) -> torch.Tensor:
    """Per chunk of ``chunk`` elements, three int64 (on the tensor's device): the plain sum of
    its words, their sum weighted by position (1, 2, ...) and their sum with odd hashed weights.
    The first two locate a single changed word (their differences' ratio is its position, see
    :func:`harness.guard.check.locate`); the third catches what the first two could miss."""
    words = _words(t)
    per = max(words.numel() // max(t.numel(), 1), 1)
    n = chunk_len(t.numel(), chunk) * per
    if words.numel() == 0:
        return torch.zeros(0, 3, dtype=torch.int64, device=t.device)
    out = []
    for rows in _rows(words, n):
        k = rows.shape[1]
        pos = torch.arange(1, k + 1, dtype=torch.int64, device=t.device)
        out.append(torch.stack([rows.sum(1), (rows * pos).sum(1),
                                (rows * _weights(k, t.device, torch.int64, True)).sum(1)], 1))
    return torch.cat(out)


def linear(t: torch.Tensor, chunk: int) -> torch.Tensor:
    """Per chunk, ``(sum w x, sum w |x|)`` in float64 (floats), or ``(sum w x, 0)`` in int64
    wrapping (integers), as a (chunks, 2) tensor on the tensor's device; the float64 order as
    the module doc defines it."""
    flat = t.detach().reshape(-1)
    n = chunk_len(flat.numel(), chunk)
    integer = not (flat.is_floating_point() or flat.is_complex())
    wide = torch.int64 if integer else torch.float64
    if flat.numel() == 0:
        return torch.zeros(0, 2, dtype=wide, device=t.device)
    out = []
    for rows in _rows(flat, n):
        if integer:  # exact in any order: elementwise, wrapping
            w = _weights(rows.shape[1], t.device, wide, False)
            s = (rows.to(wide) * w).sum(1)
            out.append(torch.stack([s, torch.zeros_like(s)], 1))
            continue
        c, k = rows.shape
        # Lane l holds elements j = l (mod 16): zeros pad the last lanes (adding +0.0 to a
        # sum that started at +0.0 leaves it unchanged), and cumsum adds in element order.
        x = torch.zeros(c, -(-k // WEIGHT_PERIOD) * WEIGHT_PERIOD, dtype=wide, device=t.device)
        x[:, :k] = rows
        x = x.view(c, -1, WEIGHT_PERIOD)
        a = x.abs()
        lanes = torch.stack([x.cumsum_(1)[:, -1], a.cumsum_(1)[:, -1]], 1)  # (c, 2, 16)
        w = torch.arange(1, WEIGHT_PERIOD + 1, dtype=wide, device=t.device)
        out.append((lanes * w).cumsum_(2)[:, :, -1])
    return torch.cat(out)


def blocks(t: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """``t`` taken flat and cut into ``parts`` equal blocks (all_gather's and
    reduce_scatter's per-rank blocks)."""
    flat = t.detach().reshape(-1)
    n = flat.numel() // max(parts, 1)
    return [flat[i * n:(i + 1) * n] for i in range(parts)]


@dataclass
class Pending:
    """Digests on their way to the host: ``host`` holds them once ``ready()``."""

    host: list[torch.Tensor]
    event: Any = None  # a CUDA event recorded after the copies, or None on CPU

    def ready(self) -> bool:
        """Whether the copies have landed (never blocks)."""
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        """Block this (checker) thread until the copies have landed: an event wait, not a
        device-wide sync."""
        if self.event is not None:
            self.event.synchronize()


def to_host(digests: list[torch.Tensor]) -> Pending:
    """Start copying ``digests`` to the host without waiting for the device."""
    if not digests or all(d.device.type == "cpu" for d in digests):
        return Pending([d for d in digests])
    host = []
    for d in digests:
        h = torch.empty(d.shape, dtype=d.dtype, pin_memory=True)
        h.copy_(d, non_blocking=True)
        host.append(h)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    return Pending(host, event)


def as_lists(p: Pending) -> list[list[Any]]:
    """The landed digests as plain lists (for the JSON the side channel carries)."""
    return [h.tolist() for h in p.host]
