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
    ("rank[0:1]", "Slice is not allowed"),  # rank[0] parses: only a table can be indexed
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


ROUTES = ((0, 2, 1), (1, 1, 3), (2, 0, 0))


def test_a_table_is_indexed_by_numbers_and_by_the_element_index() -> None:
    """Issue 43.7: per-rank split sizes from a routing table (``tables:``)."""
    e = parse("routes[src][dst] * 2", ("routes", "src", "dst"))
    assert [[e({"routes": ROUTES, "src": s, "dst": d}) for d in range(3)]
            for s in range(3)] == [[0, 4, 2], [2, 2, 6], [4, 0, 0]]
    per_element = parse("w[i] + rank", ("w", "i", "rank"))
    assert per_element({"w": (5, 6, 7), "i": torch.arange(3), "rank": 1}).tolist() == [6, 7, 8]
    # an index is itself an expression; a table round-trips to the ranks like any expression
    again = pickle.loads(pickle.dumps(parse("routes[(rank + 1) % 3][0]", ("routes", "rank"))))
    assert again({"routes": ROUTES, "rank": 2}) == 0


@pytest.mark.parametrize(("source", "env", "message"), [
    ("routes[rank]", {"rank": 0}, "'routes' has more dimensions than indices given"),
    ("routes[0][0][0]", {}, "'routes' has fewer dimensions than indices given"),
    ("routes[rank][0]", {"rank": 3}, "index 3 is out of range 0..2 of 'routes'"),
    ("routes[rank - 1][0]", {"rank": 0}, "index -1 is out of range 0..2 of 'routes'"),
    ("routes[0][1.5]", {}, "'routes' is indexed by 1.5; indices are whole numbers"),
    ("routes + 1", {}, "'routes' is a table: index it, e.g. routes[rank]"),
    ("rank[0]", {"rank": 1}, "'rank' is not a table (declare it under tables:)"),
    ("routes[0][i]", {"i": torch.arange(4)}, "index out of range 0..2 of 'routes'"),
    ("routes[i][0]", {"i": torch.arange(2)}, "a per-element index needs whole numbers and a "
     "row of numbers"),
])
def test_a_bad_index_is_an_error_not_a_wrap_or_a_crash(source: str, env: dict[str, object],
                                                        message: str) -> None:
    e = parse(source, ("routes", "rank", "i"))
    with pytest.raises(ExprError) as info:
        e({"routes": ROUTES, **env})
    assert message in str(info.value)


@pytest.mark.parametrize(("source", "fragment"), [
    ("routes[0:2]", "Slice is not allowed"), ("routes[0, 1]", "Tuple is not allowed"),
    ("(1 + 2)[0]", "only a table may be indexed"), ("max(1, 2)[0]", "only a table may be")])
def test_only_a_named_table_may_be_indexed_one_index_at_a_time(source: str,
                                                                fragment: str) -> None:
    with pytest.raises(ExprError, match=fragment):
        parse(source, ("routes",))
