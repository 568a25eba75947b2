"""The data generators: exact reductions in any order, poison that shows, rank-coded values.

The ``exact`` generator's promise is what lets the library compare float results bit for bit:
whatever order a backend reduces in (ring, tree, pairwise, by chunks), every partial result is
representable, so every order gives the same bits as the reference model. These tests reduce
the generated data in several orders with a rounding step in the narrow dtype after every
operation (what a backend does) and require identical bytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from harness import dtypes
from harness.model import Fill
from harness.ops import reduce_tensors
from harness.program import tensors

FLOATS = ["float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
          "float8_e4m3fnuz", "float8_e5m2fnuz"]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
WORLD_SIZES = [1, 2, 3, 4, 8]
N = 4096
PREMUL = 2.0


def _wide(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_complex:
        return torch.complex128
    return torch.float64 if dtype.is_floating_point else torch.int64


def _step(op: str, dtype: torch.dtype, strict: bool = True
          ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One binary reduction step, rounded (or wrapped) back to ``dtype`` like a backend."""
    w = _wide(dtype)

    def step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x, y = a.to(w), b.to(w)
        if op in ("sum", "avg", "premul_sum"):
            r = x + y
        elif op == "product":
            r = x * y
        elif op == "min":
            r = torch.minimum(x, y)
        elif op == "max":
            r = torch.maximum(x, y)
        elif op == "band":
            r = x & y
        elif op == "bor":
            r = x | y
        else:
            r = x ^ y
        out = r.to(dtype)
        if strict and (dtype.is_floating_point or dtype.is_complex):
            # Every partial result must be representable: nothing was rounded on the way.
            back = out.to(w)
            exact = (back == r) | (r.isnan() & back.isnan())
            assert bool(exact.all()), "a partial result was rounded"
        return out

    return step


def _orders(ws: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    base = list(range(ws))
    shuffled = [rng.sample(base, ws) for _ in range(3)]
    return [base, base[::-1], *shuffled]


def _fold(xs: list[torch.Tensor], step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
          ) -> torch.Tensor:
    acc = xs[0]
    for x in xs[1:]:
        acc = step(acc, x)
    return acc


def _tree(xs: list[torch.Tensor], step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
          ) -> torch.Tensor:
    while len(xs) > 1:
        xs = [step(xs[i], xs[i + 1]) if i + 1 < len(xs) else xs[i]
              for i in range(0, len(xs), 2)]
    return xs[0]


def _reduce_all_orders(name: str, op: str, ws: int, gen: str = "exact",
                       seed: int = 7) -> list[torch.Tensor]:
    dtype = tensors.torch_dtype(name)
    inputs = [tensors.generate(gen, {"seed": seed}, (N,), dtype, r, ws, op) for r in range(ws)]
    if op == "premul_sum":  # each contribution is scaled before the sum (NCCL's order)
        inputs = [(x.to(_wide(dtype)) * PREMUL).to(dtype) for x in inputs]
    step = _step(op, dtype, strict=gen == "exact")
    results = []
    for order in _orders(ws, seed):
        xs = [inputs[r] for r in order]
        results.extend([_fold(xs, step), _tree(xs, step)])
    if op == "avg":
        w = _wide(dtype)
        results = [(r.to(w) / ws).to(dtype) if dtype.is_floating_point or dtype.is_complex
                   else torch.div(r.to(w), ws, rounding_mode="trunc").to(dtype)
                   for r in results]
    ref = reduce_tensors([tensors.generate(gen, {"seed": seed}, (N,), dtype, r, ws, op)
                          for r in range(ws)], op, {"premul_factor": PREMUL})
    return [ref, *results]


def _same_bits(results: list[torch.Tensor]) -> bool:
    return all(tensors.compare("t", r, results[0], "auto", None).ok for r in results[1:])


FLOAT_CASES = [(d, op, ws) for d in FLOATS for op in ("sum", "product", "min", "max",
                                                        "premul_sum")
               for ws in WORLD_SIZES]
FLOAT_CASES += [(d, "avg", ws) for d in FLOATS for ws in (1, 2, 4, 8)]
FLOAT_CASES += [(d, op, ws) for d in ("complex64", "complex128") for op in ("sum", "avg")
                for ws in (1, 2, 4, 8)]


@pytest.mark.parametrize(("name", "op", "ws"), FLOAT_CASES)
def test_exact_float_data_reduces_to_the_same_bits_in_any_order(name: str, op: str,
                                                                 ws: int) -> None:
    results = _reduce_all_orders(name, op, ws)
    assert _same_bits(results), f"{name} {op} ws{ws}: orders disagree"
    finite = torch.view_as_real(results[0]) if results[0].is_complex() else results[0]
    assert bool(torch.isfinite(finite.to(torch.float64)).all())


INT_CASES = [(d, op, ws) for d in [*INTS, "bool"]
             for op in ("sum", "product", "min", "max", "band", "bor", "bxor")
             for ws in WORLD_SIZES]
INT_CASES += [(d, "avg", ws) for d in INTS for ws in WORLD_SIZES]


@pytest.mark.parametrize(("name", "op", "ws"), INT_CASES)
def test_exact_integer_data_reduces_to_the_same_result_in_any_order(name: str, op: str,
                                                                    ws: int) -> None:
    assert _same_bits(_reduce_all_orders(name, op, ws))


def test_the_order_test_does_catch_inexact_data() -> None:
    """Control: random float16 data summed over 8 ranks does depend on the order."""
    results = _reduce_all_orders("float16", "sum", 8, gen="random", seed=3)
    assert not _same_bits(results)


def test_exact_data_is_not_trivial() -> None:
    """Ranks contribute different, mostly non-zero values, so a lost contribution shows."""
    for name in ("float32", "bfloat16", "int32", "float16"):
        dtype = tensors.torch_dtype(name)
        a, b = (tensors.generate("exact", {"seed": 1}, (N,), dtype, r, 2, "sum") for r in (0, 1))
        assert not torch.equal(a, b)
        assert (a != 0).float().mean() > 0.9


@pytest.mark.parametrize("name", [*FLOATS, *INTS, "bool", "complex64"])
def test_poison_never_equals_a_written_value(name: str) -> None:
    dtype = tensors.torch_dtype(name)
    p = tensors.poison((8,), dtype)
    for fill in ("ranks", "exact"):
        v = tensors.generate(fill, {}, (8,), dtype, 1, 2, "sum")
        check = tensors.compare("t", p, v, "auto", None)
        assert check.wrong == 8, f"{name}: poison matched a generated {fill} value"


def test_bool_is_compared_as_bytes() -> None:
    ok = torch.tensor([True, False, True])
    non_canonical = torch.tensor([2, 0, 1], dtype=torch.uint8).view(torch.bool)
    assert torch.equal(ok, non_canonical)  # why bytes are needed
    check = tensors.compare("t", non_canonical, ok, "auto", None)
    assert not check.ok and check.wrong == 1 and check.first_wrong[0][0] == 0


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int8", "uint8", "float16", "int64"])
@pytest.mark.parametrize("ws", [2, 3, 8])
def test_ranks_generator_tells_every_source_rank_apart(name: str, ws: int) -> None:
    dtype = tensors.torch_dtype(name)
    chunks = [tensors.generate("ranks", {}, (64,), dtype, r, ws, None) for r in range(ws)]
    for r in range(ws):
        for s in range(r + 1, ws):
            assert bool((chunks[r] != chunks[s]).all()), f"ranks {r} and {s} share values"
        assert len(set(chunks[r].tolist())) > 1  # the index is encoded too


def test_nan_inf_generator_mixes_specials_and_finite_values() -> None:
    t = tensors.generate("nan_inf", {}, (10,), torch.float32, 0, 2, "max")
    assert t.isnan().any() and t.isposinf().any() and t.isneginf().any() and t.isfinite().any()


def test_materialize_builds_fills_per_rank() -> None:
    from harness.expr import parse

    expr = Fill("expr", parse("rank * 100 + i", ("rank", "world_size", "i")))
    t = tensors.materialize(expr, (3,), torch.int32, 2, 4, {}, None)
    assert t.tolist() == [200, 201, 202]
    assert dtypes.info("bfloat16").mantissa_bits == 8
