"""0-dim (scalar) tensors through the rank-side helpers: poison, digest and comparison."""

from __future__ import annotations

import pytest
import torch

from harness.program import tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_zero_dim_tensors_are_poisoned_hashed_and_compared(dtype: torch.dtype) -> None:
    p = tensors.poison((), dtype)
    assert p.dim() == 0
    one = torch.tensor(1, dtype=dtype)
    assert tensors.digest(one) != tensors.digest(p)
    assert tensors.compare("t", one.clone(), one, "explicit", None).ok
    bad = tensors.compare("t", p, one, "explicit", None)
    assert not bad.ok and bad.wrong == 1


def test_complex_tensors_still_compare_by_bits() -> None:
    a = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert tensors.compare("c", a.clone(), a, "explicit", None).ok
    b = a.clone()
    b[1] = torch.tensor(3 + 4j, dtype=torch.complex64)
    bad = tensors.compare("c", b, a, "explicit", None)
    assert not bad.ok and bad.wrong == 1
