"""The whitelisting expression evaluator, including attempts to escape it."""

from __future__ import annotations

import pickle

import pytest
import torch

from harness.errors import ExprError
from harness.expr import parse

NAMES = ("rank", "world_size", "i", "n")


def test_scalar_arithmetic() -> None:
    e = parse("(rank + 1) % world_size", NAMES)
    assert [e({"rank": r, "world_size": 4}) for r in range(4)] == [1, 2, 3, 0]
    assert parse("rank - 1 if rank > 0 else world_size - 1", NAMES)({"rank": 0,
                                                                     "world_size": 3}) == 2
    assert parse("max(rank, 2) * abs(-3) + min(1, 0)", NAMES)({"rank": 5}) == 15
    assert parse("not rank and world_size == 2", NAMES)({"rank": 0, "world_size": 2}) is True


def test_tensor_evaluation_over_the_index() -> None:
    e = parse("rank * 10 + i if i % 2 == 0 else -i", NAMES)
    got = e({"rank": 2, "i": torch.arange(5)})
    assert got.tolist() == [20, -1, 22, -3, 24]
    both = parse("i > 1 and i < 4", NAMES)({"i": torch.arange(5)})
    assert both.tolist() == [False, False, True, True, False]


def test_names_used_are_reported() -> None:
    assert parse("rank + n * 2", NAMES).names == frozenset({"rank", "n"})


@pytest.mark.parametrize(("source", "fragment"), [
    ("__import__('os').system('true')", "only these functions"),
    ("rank.__class__", "Attribute is not allowed"),
    ("().__class__.__bases__[0]", "not allowed"),
    ("[x for x in (1, 2)]", "not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("open", "unknown name 'open'"),
    ("eval('1')", "only these functions"),
    ("'abc'", "is not a number"),
    ("rank[0]", "Subscript is not allowed"),
    ("max(rank, key=1)", "keyword arguments"),
    ("x := 1", "not a valid expression"),
    ("a" * 500, "longer than"),
])
def test_escape_attempts_are_rejected_at_parse_time(source: str, fragment: str) -> None:
    with pytest.raises(ExprError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        parse(source, NAMES)


def test_resource_exhaustion_is_refused() -> None:
    with pytest.raises(ExprError, match="exponent"):
        parse("9 ** 9 ** 9", NAMES)({})
    with pytest.raises(ExprError, match="bits"):
        parse("(2 ** 100) * (2 ** 100)", NAMES)({})
    with pytest.raises(ExprError, match="shift"):
        parse("1 << 100000", NAMES)({})
    with pytest.raises(ExprError, match="division by zero"):
        parse("rank // 0", NAMES)({"rank": 1})


def test_round_trips_through_pickle_by_source() -> None:
    e = parse("rank * 2", NAMES)
    again = pickle.loads(pickle.dumps(e))
    assert again.source == "rank * 2" and again({"rank": 3}) == 6
