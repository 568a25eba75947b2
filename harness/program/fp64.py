"""Rank-side numerics: error against the FP64 reference, and expected values that are inexact.

The reference model (:mod:`harness.ops`) reduces in float64 and rounds once to the buffer's
dtype; for the error measurement the inputs are widened first, so the same model gives the
unrounded float64 (complex128) result, and the error of what the backend returned is measured
against it. Runs in rank processes (imports torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..model import ORDER_SENSITIVE, Instance, TensorCheck
from . import tensors

# Reductions whose result depends on the order of the operations (rounding, overflow).
INT64_LIMIT = 2.0**63


def widened(t: torch.Tensor, integers: bool = False) -> torch.Tensor:
    """``t`` in float64 (complex128 for complex); integers too when ``integers`` (to see the
    magnitude of an integer product that int64 cannot hold)."""
    if t.is_complex():
        return t.to(torch.complex128)
    if t.is_floating_point() or (integers and t.dtype != torch.bool):
        return t.to(torch.float64)
    return t


def error_metrics(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Error of ``got`` against the FP64 reference ``ref`` over the elements where both are
    finite: ``max_abs``, ``max_rel`` (over non-zero reference elements), ``rel_l2``
    (``||got - ref|| / ||ref||``; left out where the reference is all zeros and the error
    is not) and ``max_ulps`` (in units of ``got``'s dtype at the reference value, over the
    non-zero reference elements too). Empty for non-float buffers or where no element is
    finite on both sides."""
    got = tensors.dense_form(got.detach().cpu())
    if not (got.is_floating_point() or got.is_complex()) or got.numel() == 0:
        return {}
    wide = torch.complex128 if got.is_complex() else torch.float64
    g = got.reshape(-1).to(wide)
    e = tensors.dense_form(ref.detach().cpu()).reshape(-1).to(wide)
    if g.shape != e.shape:
        return {}
    if torch.equal(g, e):  # bit-exact (the exact generators): no need to measure
        return dict.fromkeys(("max_abs", "max_rel", "rel_l2", "max_ulps"), 0.0)
    fin = torch.isfinite(g) & torch.isfinite(e)
    if not bool(fin.any()):
        return {}
    if not bool(fin.all()):
        g, e = g[fin], e[fin]
    return _metrics((g - e).abs(), e, torch.empty(0, dtype=got.dtype).real.dtype)


def _metrics(err: torch.Tensor, e: torch.Tensor, real: torch.dtype) -> dict[str, float]:
    """The four metrics of an absolute error ``err`` per element of the reference ``e``
    (both finite, float64 or complex128), in units of ``real`` for ``max_ulps``."""
    nz = e != 0
    out = {"max_abs": float(err.max()),
           "max_rel": float((err[nz] / e[nz].abs()).max()) if bool(nz.any()) else 0.0}
    norm_e, norm_err = float(torch.linalg.vector_norm(e)), float(torch.linalg.vector_norm(err))
    if norm_e > 0:
        out["rel_l2"] = norm_err / norm_e
    elif norm_err == 0:
        out["rel_l2"] = 0.0
    # Where the exact value is 0 (cancellation) any error is "infinitely many" ulps of the
    # smallest subnormal; max_abs covers those elements, as max_rel leaves them out too.
    out["max_ulps"] = (float((err[nz] / tensors.ulp_of(e[nz].abs(), real)).max())
                       if bool(nz.any()) else 0.0)
    return {k: v for k, v in out.items() if math.isfinite(v)}


def inexact_reason(dtype: torch.dtype, reduce_op: str | None, ref: torch.Tensor,
                   magnitude: torch.Tensor | None, ranks: int = 2) -> str:
    """Why the expected value of a reduction is itself inexact at ``dtype`` ("" if it is not).

    ``ref``: the reference over widened inputs (integers too); ``magnitude``: the same
    reduction over every input's absolute values. Float sums whose sum of |x| exceeds the
    dtype's largest finite value may overflow in some summation orders and not in others.
    Over ``ranks`` >= 3 (two values are one rounding, the same in either order), a float sum
    whose sum of |x| reaches past 2**p (p: the dtype's significand bits) may have partial sums
    that are not representable, so the orders round differently: data exact in the dtype
    (``ranks``, large integers) is no exception. An integer product beyond 64 bits has no int64
    reference (and signed overflow is undefined behaviour in the C++ a backend is written in).
    """
    if reduce_op not in ORDER_SENSITIVE:
        return ""
    name = str(dtype).removeprefix("torch.")
    if (dtype.is_floating_point or dtype.is_complex) and magnitude is not None:
        real = torch.empty(0, dtype=dtype).real.dtype
        top = torch.finfo(real).max
        mag = magnitude.detach().cpu().reshape(-1)
        mag = (mag.real.abs().maximum(mag.imag.abs()) if mag.is_complex() else mag.abs())
        mag = mag.to(torch.float64)
        over = torch.isfinite(mag) & (mag > top)
        if bool(over.any()):
            i = int(over.nonzero()[0])
            return (f"{int(over.sum())} element(s) can overflow {name} in some orders of the "
                    f"{reduce_op} (element {i}: sum of |x| {float(mag[i]):.4g} > max "
                    f"{top:.4g}), so no single expected value exists")
        bits = 1 - round(math.log2(torch.finfo(real).eps))  # significand bits, implicit one too
        wide = torch.isfinite(mag) & (mag > 2.0 ** bits)
        if ranks >= 3 and reduce_op != "product" and bool(wide.any()):
            i = int(wide.nonzero()[0])
            return (f"{int(wide.sum())} element(s) of the {reduce_op} over {ranks} ranks pass "
                    f"{name}'s exact range (element {i}: sum of |x| {float(mag[i]):.4g} > "
                    f"2**{bits}), so the order of the additions decides "
                    "the rounding: no single expected value exists")
        return ""
    if reduce_op == "product" and not dtype.is_floating_point and dtype != torch.bool:
        wide = ref.detach().cpu().reshape(-1).to(torch.float64).abs()
        over = torch.isfinite(wide) & (wide >= INT64_LIMIT)
        if bool(over.any()):
            i = int(over.nonzero()[0])
            return (f"{int(over.sum())} element(s) of the {name} product exceed 64 bits "
                    f"(element {i}: |product| {float(wide[i]):.4g} >= 2**63), beyond what "
                    "the int64 reference can hold")
    return ""


def nonfinite_mismatch(got: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """Per element: got and exp are not both finite and not the same inf or both NaN."""
    g = tensors.dense_form(got.detach().cpu()).reshape(-1)
    e = tensors.dense_form(exp.detach().cpu()).reshape(-1).to(g.dtype)
    wide = torch.complex128 if g.is_complex() else torch.float64
    gw, ew = g.to(wide), e.to(wide)
    both_finite = torch.isfinite(gw) & torch.isfinite(ew)
    same = (gw == ew) | (gw.isnan() & ew.isnan())
    return ~(both_finite | same)


def floating(t: torch.Tensor) -> bool:
    """Whether ``t`` holds floats (real or complex)."""
    return t.is_floating_point() or t.is_complex()


def kinds(inst: Instance, got: torch.Tensor) -> tuple[bool, ...]:
    """Which FP64 references an ``expected: auto`` buffer needs (True: over |inputs|, the
    overflow check of sums): none for data other than floats and integer products."""
    if floating(got):
        sums = inst.reduce_op in ORDER_SENSITIVE and inst.reduce_op != "product"
        return (False, True) if sums else (False,)
    return (False,) if inst.reduce_op == "product" and got.dtype != torch.bool else ()


@dataclass(frozen=True)
class OrderBound:
    """What every summation order of a float reduction can give, per element."""

    bound: torch.Tensor  # |result - exact| <= bound for every order
    roundings: int  # k: the roundings one order makes
    gamma: float  # gamma_k = k*u / (1 - k*u)


def summation_bound(inst: Instance, dtype: torch.dtype, magnitude: torch.Tensor,
                    exact: torch.Tensor, world_size: int | None = None) -> OrderBound:
    """Higham's bound on a float reduction over the instance's group, in ``dtype`` with unit
    roundoff u: every order's result lies within gamma_k * sum|x_i| (``magnitude``) of the
    exact value, k = n - 1 roundings over n ranks (n with the scaling of avg and premul_sum),
    plus 2 ulp of the exact value for the rounding of the reference and of a final scaling.
    The one definition of the bound: ``tolerance: auto`` and the "beyond any order" check of
    an inexact expected value both use it."""
    real = torch.empty(0, dtype=dtype).real.dtype
    u = torch.finfo(real).eps / 2
    n = inst.group_size(world_size)
    k = n if inst.reduce_op in ("avg", "premul_sum") else n - 1
    gamma = k * u / (1 - k * u)
    return OrderBound(gamma * magnitude + 2 * tensors.ulp_of(exact.abs(), real), k, gamma)


def beyond_any_order(got: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor,
                     inst: Instance) -> int:
    """How many elements of a float sum lie outside what every order of the operations gives:
    ``|got - ref| > gamma_k * sum|x| + 2 ulp`` (Higham's bound; k = n - 1 roundings over n
    ranks, n with the scaling of avg and premul_sum; as ``tolerance: auto``). Such a result is
    wrong whatever the order, so it can fail an instance whose exact value is not unique."""
    g = tensors.dense_form(got.detach().cpu()).reshape(-1)
    wide = torch.complex128 if g.is_complex() else torch.float64
    e = tensors.dense_form(ref.detach().cpu()).reshape(-1).to(wide)
    m = tensors.dense_form(mag.detach().cpu()).reshape(-1).to(wide).abs()
    if g.shape != e.shape or g.shape != m.shape:
        return 0
    gw = g.to(wide)
    if torch.equal(gw, e):
        return 0
    bound = summation_bound(inst, g.dtype, m, e).bound
    fin = torch.isfinite(gw) & torch.isfinite(e) & torch.isfinite(m)
    return int(((gw - e).abs() > bound)[fin].sum())


def order_range(got: torch.Tensor, exp: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor,
                inst: Instance) -> tuple[dict[str, float], dict[str, float]]:
    """Where a case's ``error:`` bound stands when the expected value of a float sum is not
    unique: (the metrics of the exact result rounded once to the dtype, the least error any
    result can have; the metrics of Higham's bound, the most any order of the additions can
    give), over the elements finite on every side."""
    g = tensors.dense_form(got.detach().cpu()).reshape(-1)
    wide = torch.complex128 if g.is_complex() else torch.float64
    e = tensors.dense_form(ref.detach().cpu()).reshape(-1).to(wide)
    r = tensors.dense_form(exp.detach().cpu()).reshape(-1).to(wide)
    m = tensors.dense_form(mag.detach().cpu()).reshape(-1).to(wide).abs()
    if not e.shape == r.shape == m.shape or e.numel() == 0:
        return {}, {}
    real = torch.empty(0, dtype=g.dtype).real.dtype
    bound = summation_bound(inst, g.dtype, m.real, e).bound.reshape(-1)
    fin = (torch.isfinite(e) & torch.isfinite(r) & torch.isfinite(m)
           & torch.isfinite(bound))
    if not bool(fin.any()):
        return {}, {}
    e = e[fin]
    return _metrics((r[fin] - e).abs(), e, real), _metrics(bound[fin], e, real)


def annotate(check: TensorCheck, got: torch.Tensor, exp: torch.Tensor, inst: Instance,
             ref: Any, mag: Any = None) -> None:
    """Add the FP64-reference error and the inexactness of the expected value to the check of
    an ``expected: auto`` buffer (``ref``: the FP64 reference; ``mag``: the same over
    |inputs|, for sums); with error bounds (``error:``), judge its values by them: here only
    the non-finite pattern must match, the parent compares the metrics. An inexact expected
    value of a sum under such bounds also gets :func:`order_range`."""
    if not isinstance(ref, torch.Tensor):
        return
    floats = floating(got)
    if floats and inst.reduce_op == "product":
        mag = ref
    check.inexact = inexact_reason(got.dtype, inst.reduce_op, ref,
                                   mag if isinstance(mag, torch.Tensor) else None,
                                   inst.group_size())
    if not floats:
        return
    check.error = error_metrics(got, ref)
    if isinstance(mag, torch.Tensor) and inst.reduce_op != "product":
        check.beyond_order = beyond_any_order(got, ref, mag, inst)
        if check.inexact and inst.numerics is not None and inst.numerics.error:
            # The case's bound judges this result (harness.verdict.numerics); the message
            # says whether any result could meet it, and whether every order would.
            check.rounded_error, check.order_error = order_range(got, exp, ref, mag, inst)
    if inst.numerics is not None and inst.numerics.error:
        bad = nonfinite_mismatch(got, exp)
        check.wrong = int(bad.sum())
        check.ok = check.wrong == 0
        check.first_wrong = [(i, *pair) for i, pair in
                             ((int(i), (repr(float(exp.reshape(-1)[i].real)),
                                        repr(float(got.reshape(-1)[i].real))))
                              for i in bad.nonzero().flatten()[:tensors.FIRST_WRONG].tolist())]
        check.note = ("values judged by the error bound against the FP64 reference"
                      + ("" if check.ok else "; the non-finite elements differ"))
