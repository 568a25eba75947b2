"""Rank-side tensor work: build buffers from fills, poison outputs, compare with expectations.

Runs inside rank processes (imports torch at module import). Values are pure functions of
(fill, rank, world size, element index), so every rank can rebuild every other rank's input
to compute reference results locally, as nccl-tests does.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import torch

from .. import dtypes
from ..model import Fill, TensorCheck, Tolerance

FIRST_WRONG = 5
_EXACT_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a canonical name (AttributeError if this torch lacks it)."""
    dt = getattr(torch, name)
    assert isinstance(dt, torch.dtype)
    return dt


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A fresh row-major copy (``contiguous()`` keeps stride-0 views of one element).

    bool tensors are copied as bytes: torch's copy kernels turn any non-zero byte into 1,
    which would hide a backend's non-canonical bools (and the 0xA5 poison).
    """
    if t.dtype == torch.bool:
        return _dense(t.view(torch.uint8)).view(torch.bool)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` with its exact bytes (for "unchanged" checks); a sparse tensor's
    dense form (duplicate indices summed)."""
    return _dense(dense_form(t.detach().cpu()))


def dense_form(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or the dense form of a sparse COO tensor (duplicates summed)."""
    return t.to_dense() if t.layout == torch.sparse_coo else t


def to_sparse(t: torch.Tensor, sparse_dim: int | None, uncoalesced: bool) -> torch.Tensor:
    """A sparse COO tensor of ``t``'s non-zero elements (``layout: sparse_coo``).

    The first ``sparse_dim`` dims are indexed (None: all). ``uncoalesced`` stores every
    entry twice at the same index, holding two parts of its value that sum to it exactly
    (halves for floats, floor half and the rest for integers, the value twice for bool), so
    a backend that keeps one duplicate instead of summing them is caught.
    """
    sp = t.to_sparse() if sparse_dim is None or t.dim() == 0 else t.to_sparse(sparse_dim)
    if not uncoalesced:
        return sp
    idx, vals = sp.indices(), sp.values()
    if vals.dtype == torch.bool:
        first, second = vals, vals
    elif vals.is_floating_point() or vals.is_complex():
        first = vals * 0.5
        second = vals - first
    else:
        first = torch.div(vals, 2, rounding_mode="floor")
        second = vals - first
    return torch.sparse_coo_tensor(torch.cat([idx, idx], 1), torch.cat([first, second]),
                                   t.shape, dtype=t.dtype, device=t.device,
                                   check_invariants=True)


def _bits_view(t: torch.Tensor) -> torch.Tensor:
    size = t.element_size()
    dense = _dense(t)
    if dense.dim() == 0:  # a 0-dim tensor cannot be viewed as another element size
        dense = dense.reshape(1)
    return dense.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def poison(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A buffer whose every element shows up as wrong if the op never writes it."""
    if dtype in _EXACT_FLOATS or dtype.is_complex:
        return torch.full(shape, float("nan"), dtype=dtype)
    t = torch.empty(shape, dtype=dtype)
    t.reshape(-1).view(torch.uint8).fill_(0xA5)  # reshape: 0-dim tensors too
    return t


def _gen_rng(seed: int, rank: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + rank * 7919 + 12345) % (2**63))
    return g


def generate(name: str, params: Mapping[str, Any], shape: tuple[int, ...], dtype: torch.dtype,
             rank: int, world_size: int, reduce_op: str | None) -> torch.Tensor:
    """Values of a named generator (docs/reference/case-format.md)."""
    n = 1
    for d in shape:
        n *= d
    seed = int(params.get("seed", 0))
    # ``rank: R`` makes the values rank R would generate (what another rank should receive).
    rank = int(params.get("rank", rank))
    info = dtypes.info(str(dtype).removeprefix("torch."))
    if name == "constant":
        return torch.full(shape, params.get("value", 1), dtype=dtype)
    if name == "ranks":
        return _ranks_code(n, info, rank, world_size).reshape(shape).to(dtype)
    if name == "nan_inf":
        specials = torch.tensor([float("nan"), float("inf"), float("-inf"), 1.0, -2.0],
                                dtype=torch.float64)
        idx = (torch.arange(n) + rank) % len(specials)
        return specials[idx].reshape(shape).to(dtype)
    g = _gen_rng(seed, rank)
    if name == "random":
        if info.kind in ("float", "float8", "complex"):
            vals = torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1
            return vals.reshape(shape).to(dtype)
        return _random_bits(n, info, g).reshape(shape).to(dtype)
    if name == "exact":
        return _exact(n, info, g, rank, world_size, reduce_op or "sum").reshape(shape).to(dtype)
    raise ValueError(f"unknown generator {name!r}")


def _ranks_code(n: int, info: dtypes.DtypeInfo, rank: int, world_size: int) -> torch.Tensor:
    """Encode (source rank, index) so a misplaced chunk is visible, exactly representable."""
    if info.kind == "bool":
        return (torch.arange(n) + rank) % 2 == 1
    if info.kind in ("float", "float8", "complex"):
        limit = 2 ** min(info.mantissa_bits, 24)
    else:
        limit = 2 ** min(info.bits - (1 if info.kind == "int" else 0), 24)
    k = max(1, limit // (world_size + 1))
    codes: torch.Tensor = ((rank + 1) * k + torch.arange(n) % k).to(torch.int64)
    return codes


def _random_bits(n: int, info: dtypes.DtypeInfo, g: torch.Generator) -> torch.Tensor:
    if info.kind == "bool":
        return torch.randint(0, 2, (n,), generator=g) == 1
    bits = min(info.bits, 62)
    lo = -(2 ** (bits - 1)) if info.kind == "int" else 0
    hi = 2 ** (bits - 1) if info.kind == "int" else 2**bits
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64)


def _exact(n: int, info: dtypes.DtypeInfo, g: torch.Generator, rank: int, world_size: int,
           reduce_op: str) -> torch.Tensor:
    """Data whose reduction is exact in any order (anchors.md, "Exact data")."""
    if info.kind == "bool":
        # Mostly True for sums, so several ranks' Trues meet at most indices: a backend that
        # adds bool bytes (1 + 1 = 2) instead of OR-ing them shows up.
        cut = 3 if reduce_op in ("sum", "avg", "premul_sum") else 2
        return torch.randint(0, 4, (n,), generator=g) < cut
    if info.kind in ("int", "uint"):
        if reduce_op in ("sum", "avg", "premul_sum"):
            lim = max(1, min(2 ** (info.bits - 2) // world_size, 1000))
            lo = -lim if info.kind == "int" else 0
            return torch.randint(lo, lim + 1, (n,), generator=g, dtype=torch.int64)
        if reduce_op == "product":
            choices = torch.tensor([1, 2, 3] if info.kind == "uint" else [-1, 1, 2])
            return choices[torch.randint(0, 3, (n,), generator=g)]
        return _random_bits(n, info, g)
    p = info.mantissa_bits
    if reduce_op in ("sum", "avg", "premul_sum"):
        # Integers times one shared power of two, |sum| < 2**p: every partial sum is exact.
        m = max(1, (2**p - 1) // world_size)
        ints = torch.randint(-m, m + 1, (n,), generator=g, dtype=torch.int64)
        vals = ints.to(torch.float64) * 0.125
    elif reduce_op == "product":
        # One rank contributes a mantissa, the others +-2**k: products only shift exponents.
        if rank == 0:
            mant = torch.randint(1, 2 ** (p - 1) + 1, (n,), generator=g).to(torch.float64)
            sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
            vals = mant * sign / 2 ** (p - 1)
        else:
            # float8's narrow exponent range cannot hold 2**-(world_size-1) times a mantissa
            # step: keep its factors >= 1 (and <= 2**(world_size-1), well below its max).
            low = 0 if info.kind == "float8" else -1
            k = torch.randint(low, 2, (n,), generator=g).to(torch.float64)
            sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
            vals = torch.pow(2.0, k) * sign
    else:
        m = 2 ** min(p, 20)
        vals = torch.randint(-m, m + 1, (n,), generator=g).to(torch.float64) * 0.25
    if info.kind == "complex":
        imag = vals.flip(0) if n else vals
        return torch.complex(vals, imag)
    return vals


def entry_index(shape: tuple[int, ...], entries: tuple[tuple[int, ...], ...] | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element: ``j``, the list entry it belongs to, and ``k``, its index in the entry.

    For a buffer with per-entry shapes the entries are its consecutive pieces; for a plain
    tensor they are the slices along dim 0 (what a list role passes as entries).
    """
    if entries is not None:
        sizes = [_numel(e) for e in entries]
        counts = torch.tensor(sizes, dtype=torch.int64)
        j = torch.repeat_interleave(torch.arange(len(sizes)), counts)
        starts = torch.cumsum(torch.tensor([0, *sizes[:-1]], dtype=torch.int64), 0)
        return j, torch.arange(int(j.numel())) - starts[j]
    n = _numel(shape)
    row = _numel(shape[1:]) if shape else 1
    i = torch.arange(n, dtype=torch.int64)
    return (i // row, i % row) if row else (i, i)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def entry_views(flat: torch.Tensor, entries: tuple[tuple[int, ...], ...]) -> list[torch.Tensor]:
    """The list entries of a flat buffer: views of its consecutive pieces, reshaped."""
    out: list[torch.Tensor] = []
    start = 0
    for shape in entries:
        n = _numel(shape)
        out.append(flat.narrow(0, start, n).view(shape))
        start += n
    return out


def flatten_entries(value: Any) -> torch.Tensor:
    """One flat tensor of a reference result given as a list of entries (or a tensor)."""
    if isinstance(value, torch.Tensor):
        return value.reshape(-1)
    parts = [t.reshape(-1) for t in value]
    return torch.cat(parts) if parts else torch.empty(0)


def materialize(fill: Fill, shape: tuple[int, ...] | None, dtype: torch.dtype, rank: int,
                world_size: int, env: Mapping[str, Any], reduce_op: str | None,
                entries: tuple[tuple[int, ...], ...] | None = None) -> torch.Tensor:
    """Build this rank's contiguous CPU tensor for ``fill`` (already resolved for the rank).

    ``entries``: the entry shapes of a list buffer with per-entry shapes (``shape`` is then
    its flat length); expressions see ``j``/``k`` (entry, index in the entry) besides ``i``.
    """
    kind = fill.kind
    if kind == "list":
        data = fill.data
        if isinstance(data, list):
            t = torch.tensor(data, dtype=torch.float64 if dtype.is_floating_point else None)
            t = t.to(dtype)
            if shape is not None and tuple(t.shape) != tuple(shape):
                t = t.reshape(shape)
            return t
        assert shape is not None, "a scalar fill needs a shape"
        return torch.full(shape, data, dtype=dtype)
    assert shape is not None, f"a {kind} fill needs a shape"
    if kind == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if kind == "poison":
        return poison(shape, dtype)
    if kind == "expr":
        n = 1
        for d in shape:
            n *= d
        j, k = entry_index(shape, entries)
        value = fill.data({**env, "rank": rank, "world_size": world_size,
                           "i": torch.arange(n, dtype=torch.int64), "j": j, "k": k})
        t = torch.as_tensor(value)
        if t.dtype == torch.bool and dtype != torch.bool:
            t = t.to(torch.int64)
        if dtype == torch.bool:
            t = t != 0
        if t.dim() == 0:
            t = t.expand(n).clone()
        return t.reshape(shape).to(dtype)
    if kind == "generator":
        name, params = fill.data
        return generate(name, dict(params), shape, dtype, rank, world_size, reduce_op)
    raise ValueError(f"cannot build a tensor from a {kind!r} fill")


def with_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Return a tensor holding ``t``'s values (bytes, for bool) in the requested layout.

    ``channels_last`` applies to 4-d tensors, and to each entry of a 5-d tensor whose dim 0
    enumerates 4-d list entries (the output list of a gather of channels_last tensors).
    """
    if layout == "contiguous":
        return t
    if t.dtype == torch.bool:
        return with_layout(t.view(torch.uint8), layout).view(torch.bool)
    if layout == "transposed":
        if t.dim() < 2:
            base = torch.empty((*t.shape, 2), dtype=t.dtype, device=t.device)
            view = base[..., 0]
        else:
            base = torch.empty(tuple(reversed(t.shape)), dtype=t.dtype, device=t.device)
            view = base.permute(*reversed(range(t.dim())))
        view.copy_(t)
        return view
    if layout == "strided":
        if t.dim() == 0:
            return t
        base = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
        view = base[..., ::2]
        view.copy_(t)
        return view
    if layout == "channels_last":
        if t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        if t.dim() == 5:
            n, c, h, w = t.shape[1:]
            base = torch.empty((t.shape[0], n, h, w, c), dtype=t.dtype, device=t.device)
            view = base.permute(0, 1, 4, 2, 3)
            view.copy_(t)
            return view
        raise ValueError("layout channels_last needs a 4-d shape (or a list of 4-d entries)")
    raise ValueError(f"unknown layout {layout!r}")


def at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous view holding ``t``'s bytes that starts ``offset`` elements into a larger
    allocation (nccl-tests ``-u``); ``t`` itself for offset 0 or a sparse tensor."""
    if not offset or t.layout != torch.strided:
        return t
    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = flat.narrow(0, offset, t.numel()).view(t.shape)
    if t.dtype == torch.bool:  # copy the bytes: bool copies canonicalise them
        view.view(torch.uint8).copy_(t.view(torch.uint8))
    else:
        view.copy_(t)
    return view


def digest(t: torch.Tensor) -> str:
    """A short hash of the tensor's bytes (cross-rank agreement checks)."""
    flat = _dense(dense_form(t.detach().cpu())).reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return hashlib.sha256(data).hexdigest()[:16]


def _fmt(x: torch.Tensor) -> str:
    if x.dtype == torch.bool:
        byte = int(x.reshape(1).view(torch.uint8).item())
        return str(bool(byte)) if byte in (0, 1) else f"True (byte {byte})"
    if x.dtype.is_floating_point and x.dtype not in _EXACT_FLOATS:
        return repr(float(x.to(torch.float32).item()))
    return repr(x.item())


def ulp_of(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each of ``values`` (float64; the subnormal spacing at 0)."""
    fi = torch.finfo(dtype)
    mag = values.abs().to(torch.float64).clamp(min=fi.tiny)
    _, exp = torch.frexp(mag)
    spacing = torch.ldexp(torch.ones_like(mag), exp - (_precision(dtype)))
    return spacing.clamp(min=fi.tiny * fi.eps)


def _precision(dtype: torch.dtype) -> int:
    """Significand bits including the implicit one (24 for float32)."""
    eps = torch.finfo(dtype).eps
    return 1 + round(-math.log2(eps))


def error_stats(got: torch.Tensor, exp: torch.Tensor) -> str:
    """``max abs error 0.5, max rel error 0.01, max 3 ulp`` over the elements where both are
    finite (empty when there are none, or for non-float dtypes), after the count of elements
    that are NaN or infinite on one side and not the same on the other: an error over the
    finite ones alone would read "max abs error 0" beside "expected nan got -2.0"."""
    if not (got.is_floating_point() or got.is_complex()):
        return ""
    wide = torch.complex128 if got.is_complex() else torch.float64
    g, e = got.reshape(-1).to(wide), exp.reshape(-1).to(wide)
    fin = torch.isfinite(g) & torch.isfinite(e)
    odd = int((~fin & ~(torch.isnan(g) & torch.isnan(e)) & (g != e)).sum())
    note = f"{odd} element(s) NaN or infinite on one side only" if odd else ""
    if not bool(fin.any()):
        return note
    g, e = g[fin], e[fin]
    if odd and not bool((g != e).any()):
        return note
    err = (g - e).abs()
    nz = e != 0
    rel = float((err[nz] / e[nz].abs()).max()) if bool(nz.any()) else 0.0
    real = torch.empty(0, dtype=got.dtype).real.dtype
    ulps = float((err / ulp_of(e.abs(), real)).max())
    return ((f"{note}; over the finite ones: " if note else "")
            + f"max abs error {float(err.max()):.3g}, max rel error {rel:.3g}, "
            f"max {ulps:.3g} ulp")


def compare(name: str, got: torch.Tensor, exp: torch.Tensor, how: str,
            tol: Tolerance | None, bound: torch.Tensor | None = None,
            tol_text: str = "") -> TensorCheck:
    """Compare bit for bit (NaN equals any NaN; bool as bytes) or within a tolerance.

    ``bound``: an allowed absolute error per element (``tolerance: auto``), described by
    ``tol_text``. A failed float comparison notes the largest errors and the tolerance used.
    """
    # A sparse COO result is compared in its dense form: what a sparse all_reduce must
    # produce is the coalesced sum, whatever indices and duplicates it stores.
    got = dense_form(got.detach().cpu())
    exp = dense_form(exp.detach().cpu())
    check = TensorCheck(tensor=name, ok=True, expectation=how, total=exp.numel(),
                        digest=digest(got))
    if tuple(got.shape) != tuple(exp.shape) or got.dtype != exp.dtype:
        check.ok = False
        check.note = (f"shape/dtype differ: expected {tuple(exp.shape)} {exp.dtype}, "
                      f"got {tuple(got.shape)} {got.dtype}")
        check.wrong = exp.numel()
        return check
    if got.dtype == torch.bool and exp.dtype == torch.bool:  # keep the raw bytes
        got, exp = _dense(got), _dense(exp)
    g, e = got.reshape(-1), exp.reshape(-1)
    floats = g.is_floating_point() or g.is_complex()
    tolerant = floats and (bound is not None or (
        tol is not None and (tol.atol or tol.rtol or tol.ulp)))
    if tolerant:
        wide = torch.complex128 if g.is_complex() else torch.float64
        gw, ew = g.to(wide), e.to(wide)
        eq = torch.zeros(g.shape, dtype=torch.bool)
        if tol is not None and (tol.atol or tol.rtol):
            eq |= torch.isclose(gw, ew, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        if tol is not None and tol.ulp:
            real = torch.empty(0, dtype=g.dtype).real.dtype
            eq |= (gw - ew).abs() <= tol.ulp * ulp_of(ew.abs(), real)
        if bound is not None:
            eq |= (gw - ew).abs() <= bound.reshape(-1).to(torch.float64)
        eq |= (gw == ew) | (gw.isnan() & ew.isnan())  # equal infinities, NaN for NaN
    elif g.dtype == torch.bool:
        eq = g.view(torch.uint8) == e.view(torch.uint8)
    elif g.is_complex():
        gr, er = torch.view_as_real(g), torch.view_as_real(e)
        eq = ((_bits_view(gr) == _bits_view(er)) | (gr.isnan() & er.isnan())).all(-1)
    elif g.is_floating_point():
        gn = g.to(torch.float32).isnan() if g.dtype not in _EXACT_FLOATS else g.isnan()
        en = e.to(torch.float32).isnan() if e.dtype not in _EXACT_FLOATS else e.isnan()
        eq = (_bits_view(g) == _bits_view(e)) | (gn & en)
    else:
        eq = g == e
    bad = (~eq).nonzero().flatten()
    check.wrong = int(bad.numel())
    check.ok = check.wrong == 0
    for idx in bad[:FIRST_WRONG].tolist():
        check.first_wrong.append((int(idx), _fmt(e[idx]), _fmt(g[idx])))
    if not check.ok and floats:
        stats = error_stats(g, e)
        used = tol_text or (tol.describe() if tol is not None else "compared bit for bit")
        check.note = f"{stats}; {used}" if stats else used
    return check
