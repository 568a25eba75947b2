"""The reference model (each op's ``reference()``) against results worked out by hand.

``expected: auto`` is only as good as these references: which ranks' buffers an op defines,
which it must leave alone (None = unspecified by the contract, the input back = unchanged),
what AVG means for integers, how PREMUL_SUM scales, how groups map positions to ranks.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness import ops
from harness.ops import RefContext, reduce_tensors


def ctx(ws: int, reduce_op: str | None = None, group: tuple[int, ...] | None = None,
        out_shape: tuple[int, ...] = (), **args: Any) -> RefContext:
    return RefContext(world_size=ws, group_ranks=group or tuple(range(ws)), reduce_op=reduce_op,
                      args={"premul_factor": 2.0, **args}, out_shape=out_shape)


def t(values: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# -- reduce ops -----------------------------------------------------------------------------

REDUCTIONS = [
    ("sum", [[1, -2, 3], [4, 5, -6], [0.5, 0, 1]], [5.5, 3, -2], torch.float32),
    ("product", [[1, -2, 3], [4, 5, -6], [0.5, 1, 2]], [2, -10, -36], torch.float32),
    ("min", [[1, -2, 3], [4, 5, -6], [0.5, 0, 1]], [0.5, -2, -6], torch.float32),
    ("max", [[1, -2, 3], [4, 5, -6], [0.5, 0, 1]], [4, 5, 3], torch.float32),
    ("avg", [[1, -2, 3], [4, 5, -6], [1, 0, 0]], [2, 1, -1], torch.float32),
    ("premul_sum", [[1, -2, 3], [4, 5, -6], [1, 0, 0]], [12, 6, -6], torch.float32),
    ("band", [[0b1100, 7, -1], [0b1010, 3, 5], [0b1110, 1, 4]], [0b1000, 1, 4], torch.int32),
    ("bor", [[0b1100, 7, 0], [0b1010, 8, 5], [0b0001, 1, 0]], [0b1111, 15, 5], torch.int32),
    ("bxor", [[0b1100, 7, 0], [0b1010, 8, 5], [0b0001, 1, 5]], [0b0111, 14, 0], torch.int32),
    # AVG of integers: the sum divided by the world size, truncated toward zero (C division).
    ("avg", [[-3, 3, 7], [0, 0, 0], [0, 1, 1]], [-1, 1, 2], torch.int64),
    ("premul_sum", [[1, 2, -3], [1, 0, 0], [0, 0, 0]], [4, 4, -6], torch.int32),
    # Narrow integers wrap around, as the backends' fixed-width arithmetic does.
    ("sum", [[100, -100, 127], [100, -100, 1], [0, 0, 0]], [-56, 56, -128], torch.int8),
    ("product", [[16, 255, 3], [16, 2, 3], [1, 1, 3]], [0, 254, 27], torch.uint8),
]


@pytest.mark.parametrize(("op", "inputs", "expected", "dtype"), REDUCTIONS)
def test_reduce_tensors_matches_hand_results(op: str, inputs: list[list[float]],
                                             expected: list[float], dtype: torch.dtype) -> None:
    got = reduce_tensors([t(x, dtype) for x in inputs], op, {"premul_factor": 2.0})
    assert same(got, t(expected, dtype)), got


def test_bool_reductions_are_logical_and_canonical() -> None:
    a, b, c = t([1, 1, 0, 0], torch.bool), t([1, 0, 1, 0], torch.bool), t([1, 0, 0, 0],
                                                                           torch.bool)
    cases = {"sum": [1, 1, 1, 0], "max": [1, 1, 1, 0], "bor": [1, 1, 1, 0],
             "product": [1, 0, 0, 0], "min": [1, 0, 0, 0], "band": [1, 0, 0, 0],
             "bxor": [1, 1, 1, 0]}
    for op, exp in cases.items():
        got = reduce_tensors([a, b, c], op, {})
        # Bytes, not truth values: a SUM of three Trues is the byte 1, never 3.
        assert got.view(torch.uint8).tolist() == exp, op
    with pytest.raises(ValueError):
        reduce_tensors([a, b], "avg", {})


def test_float_avg_of_three_is_the_correctly_rounded_quotient() -> None:
    got = reduce_tensors([t([1.0], torch.float16), t([1.0], torch.float16),
                          t([0.0], torch.float16)], "avg", {})
    assert same(got, t([2 / 3], torch.float16))


def test_complex_avg_divides_each_part_with_one_rounding() -> None:
    xs = [t([1 + 1j], torch.complex64), t([1 + 0j], torch.complex64),
          t([0 + 2j], torch.complex64)]
    got = reduce_tensors(xs, "avg", {})
    assert torch.view_as_real(got).tolist() == [[torch.tensor(2 / 3).item(), 1.0]]
    big = [t([1e15 + 3j], torch.complex128), t([2e15 + 1j], torch.complex128),
           t([1.0 + 0j], torch.complex128)]
    got = reduce_tensors(big, "avg", {})
    assert torch.view_as_real(got).tolist() == [[(3e15 + 1.0) / 3, 4 / 3]]


def test_avg_allows_two_ulp_only_where_the_world_size_is_not_a_power_of_two() -> None:
    from harness.ops import reference_tolerance

    assert reference_tolerance("avg", 3, "float32") == (0.0, 2 * 2.0**-23)
    assert reference_tolerance("avg", 3, "bfloat16") == (0.0, 2 * 2.0**-7)
    assert reference_tolerance("avg", 3, "complex64") == (0.0, 2 * 2.0**-23)
    assert reference_tolerance("avg", 4, "float32") is None
    assert reference_tolerance("sum", 3, "float32") is None
    assert reference_tolerance("avg", 3, "int32") is None


def test_nan_propagates_through_min_and_max() -> None:
    nan = float("nan")
    for op in ("min", "max"):
        got = reduce_tensors([t([nan, 1.0]), t([1.0, nan])], op, {})
        assert got.isnan().all(), op
    got = reduce_tensors([t([float("inf"), 1.0]), t([float("-inf"), 2.0])], "sum", {})
    assert got[0].isnan() and got[1] == 3


# -- collectives ----------------------------------------------------------------------------

def ref(op: str, inputs: list[Any], c: RefContext) -> list[Any]:
    return ops.get(op).reference(inputs, c)


def test_all_reduce_in_a_group_leaves_other_ranks_unchanged() -> None:
    xs = [t([r * 10.0]) for r in range(4)]
    out = ref("all_reduce", xs, ctx(4, "sum", group=(1, 3)))
    assert same(out[1], t([40.0])) and same(out[3], t([40.0]))
    assert same(out[0], xs[0]) and same(out[2], xs[2])


def test_broadcast_copies_the_source_to_members_only() -> None:
    xs = [t([r, r]) for r in range(3)]
    out = ref("broadcast", xs, ctx(3, src=2))
    assert all(same(o, t([2.0, 2.0])) for o in out)
    out = ref("broadcast", xs, ctx(3, src=2, group=(0, 2)))
    assert same(out[0], t([2.0, 2.0])) and same(out[1], xs[1])


def test_reduce_defines_only_the_destination() -> None:
    xs = [t([1.0, 2.0]), t([3.0, 4.0]), t([5.0, 6.0])]
    out = ref("reduce", xs, ctx(3, "sum", dst=1))
    assert out[0] is None and out[2] is None  # scratch space: unspecified
    assert same(out[1], t([9.0, 12.0]))
    out = ref("reduce", xs, ctx(3, "max", group=(0, 2), dst=2))
    assert same(out[2], t([5.0, 6.0])) and out[0] is None and same(out[1], xs[1])


def test_all_gather_stacks_members_in_rank_order() -> None:
    xs = [t([r, -r]) for r in range(3)]
    out = ref("all_gather", xs, ctx(3))
    assert all(same(o, t([[0, 0], [1, -1], [2, -2]])) for o in out)
    out = ref("all_gather", xs, ctx(3, group=(0, 2)))
    assert same(out[2], t([[0, 0], [2, -2]])) and out[1] is None


def test_gather_fills_only_the_destination_list() -> None:
    xs = [t([r]) for r in range(3)]
    out = ref("gather", xs, ctx(3, dst=2))
    assert out[0] is None and out[1] is None and same(out[2], t([[0.0], [1.0], [2.0]]))


def test_scatter_gives_each_member_its_chunk() -> None:
    src = t([[10, 11], [20, 21], [30, 31]])
    xs = [src if r == 1 else t([[0, 0]] * 3) for r in range(3)]
    out = ref("scatter", xs, ctx(3, src=1))
    assert [o.tolist() for o in out] == [[10, 11], [20, 21], [30, 31]]
    out = ref("scatter", [t([[1], [2]]), t([[0], [0]]), t([[3], [4]])], ctx(3, src=2,
                                                                         group=(0, 2)))
    assert out[0].tolist() == [3] and out[1] is None and out[2].tolist() == [4]


def test_reduce_scatter_reduces_then_hands_out_chunks() -> None:
    xs = [t([[1, 2], [3, 4]]), t([[10, 20], [30, 40]])]
    out = ref("reduce_scatter", xs, ctx(2, "sum"))
    assert out[0].tolist() == [11, 22] and out[1].tolist() == [33, 44]


def test_all_to_all_transposes_chunks() -> None:
    xs = [t([[r * 10 + d] for d in range(3)]) for r in range(3)]
    out = ref("all_to_all", xs, ctx(3))
    for r in range(3):
        assert out[r].tolist() == [[s * 10 + r] for s in range(3)]


@pytest.mark.parametrize("op", ["all_gather_into_tensor", "all_gather_single"])
def test_single_tensor_all_gather_concat_and_stack(op: str) -> None:
    xs = [t([[r, r + 0.5]]) for r in range(2)]  # shape [1, 2]
    entry = ops.get(op)
    assert entry.out_shape((1, 2), 2, {"form": "concat"}) == (2, 2)
    assert entry.out_shape((1, 2), 2, {"form": "stack"}) == (2, 1, 2)
    out = ref(op, xs, ctx(2, out_shape=(2, 2), form="concat"))
    assert out[0].tolist() == [[0, 0.5], [1, 1.5]] and same(out[0], out[1])
    out = ref(op, xs, ctx(2, out_shape=(2, 1, 2), form="stack"))
    assert out[1].tolist() == [[[0, 0.5]], [[1, 1.5]]]


@pytest.mark.parametrize("op", ["gather_single", "gather_into_tensor"])
def test_gather_into_one_tensor_only_on_the_destination(op: str) -> None:
    entry = ops.get(op)
    assert entry.roles[1].only == "dst" and entry.seen_from == "2.15"
    assert entry.out_shape((1, 2), 3, {"form": "concat"}) == (3, 2)
    assert entry.out_shape((1, 2), 3, {"form": "stack"}) == (3, 1, 2)
    xs = [t([[r, r + 0.5]]) for r in range(3)]
    out = ref(op, xs, ctx(3, out_shape=(3, 2), dst=2, form="concat"))
    assert out[0] is None and out[1] is None  # never handed to the op: checked unchanged
    assert out[2].tolist() == [[0, 0.5], [1, 1.5], [2, 2.5]]


@pytest.mark.parametrize("op", ["reduce_scatter_tensor", "reduce_scatter_single"])
def test_single_tensor_reduce_scatter_concat_and_stack(op: str) -> None:
    entry = ops.get(op)
    assert entry.out_shape((4, 3), 2, {"form": "concat"}) == (2, 3)
    assert entry.out_shape((2, 3), 2, {"form": "stack"}) == (3,)
    xs = [t([0, 1, 2, 3]), t([10, 20, 30, 40])]
    out = ref(op, xs, ctx(2, "sum", out_shape=(2,)))
    assert out[0].tolist() == [10, 21] and out[1].tolist() == [32, 43]
    out = ref(op, [x.reshape(2, 2) for x in xs], ctx(2, "max", out_shape=(2,), form="stack"))
    assert out[0].tolist() == [10, 20] and out[1].tolist() == [30, 40]


def test_all_to_all_single_even_split() -> None:
    xs = [t([r * 10 + k for k in range(4)]) for r in range(2)]
    out = ref("all_to_all_single", xs, ctx(2))
    assert out[0].tolist() == [0, 1, 10, 11] and out[1].tolist() == [2, 3, 12, 13]


def test_all_to_all_single_uneven_split_matrix() -> None:
    # splits[s][d]: rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 3 then 0.
    splits = ((1, 2), (3, 0))
    entry = ops.get("all_to_all_single")
    shapes = entry.rank_shapes((0, 2), 2, {"splits": splits})
    assert shapes == [((3, 2), (4, 2)), ((3, 2), (2, 2))]
    xs = [t([[0, 0], [1, 1], [2, 2]]), t([[10, 10], [11, 11], [12, 12]])]
    out = ref("all_to_all_single", xs, ctx(2, splits=splits))
    assert out[0].tolist() == [[0, 0], [10, 10], [11, 11], [12, 12]]
    assert out[1].tolist() == [[1, 1], [2, 2]]


def test_coalesced_references() -> None:
    xs = [t([[1, 2], [3, 4]]), t([[10, 20], [30, 40]])]
    for op in ("all_reduce_coalesced", "coalescing_manager_all_reduce"):
        out = ref(op, xs, ctx(2, "sum"))
        assert out[0].tolist() == [[11, 22], [33, 44]] and same(out[0], out[1])
    out = ref("all_gather_coalesced", xs, ctx(2))
    assert out[1].tolist() == [[[1, 2], [3, 4]], [[10, 20], [30, 40]]]
    out = ref("coalescing_manager_all_gather", xs, ctx(2))
    assert out[0].tolist() == [[1, 2, 10, 20], [3, 4, 30, 40]]
    ys = [t([[1, 2, 3, 4]]), t([[10, 20, 30, 40]])]
    out = ref("coalescing_manager_reduce_scatter", ys, ctx(2, "sum", out_shape=(1, 2)))
    assert out[0].tolist() == [[11, 22]] and out[1].tolist() == [[33, 44]]


def test_object_references() -> None:
    objs = [{"r": 0}, "one", [2, None]]
    out = ref("all_gather_object", objs, ctx(3))
    assert out[0] == objs and out[2] == objs
    out = ref("gather_object", objs, ctx(3, dst=1))
    assert out[1] == objs and out[0] is None and out[2] is None
    lists = [["a", 1], ["<poison>", "<poison>"], ["x", "y"]]
    out = ref("broadcast_object_list", lists, ctx(3, src=0))
    assert out == [["a", 1]] * 3
    out = ref("scatter_object_list", [["s0", "s1", "s2"], [None], [None]], ctx(3, src=0))
    assert out == [["s0"], ["s1"], ["s2"]]


def test_every_op_in_the_table_declares_its_buffers() -> None:
    for name, op in ops.ALL_OPS.items():
        assert op.name == name and op.family
        if op.in_role:
            assert op.role(op.in_role) and op.role(op.out_role)
        assert op.bus_factor(4) > 0


def test_bus_bandwidth_factors_follow_nccl_tests() -> None:
    # busbw = algbw * F(n): all_reduce 2(n-1)/n; gathers, reduce-scatters, all-to-all (n-1)/n;
    # broadcast, reduce, point-to-point 1.
    expected = {"all_reduce": 1.5, "all_gather": 0.75, "all_gather_into_tensor": 0.75,
                "reduce_scatter": 0.75, "reduce_scatter_tensor": 0.75, "all_to_all": 0.75,
                "all_to_all_single": 0.75, "broadcast": 1.0, "reduce": 1.0, "send": 1.0}
    assert {name: ops.get(name).bus_factor(4) for name in expected} == expected
