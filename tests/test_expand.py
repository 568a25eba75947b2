"""Matrix expansion: readable, stable ids; axes; per-backend overrides."""

from __future__ import annotations

import pytest

from harness.casefile import overrides
from harness.errors import CaseFileError, CaseFileErrors
from tests.helpers import case_error
from tests.helpers import case_instances as instances


def test_cross_product_and_id_order() -> None:
    got = instances("""
    cases:
      - name: m
        op: all_reduce
        world_size: [2, 4]
        dtype: [bf16, int64]
        reduce_op: [sum, max]
        async: [false, true]
        shape: [3]
        input: "rank + i"
    """)
    assert len(got) == 16
    ids = [i.id for i in got]
    assert ids[0] == "gloo-ws2-bfloat16-sum-sync"
    assert "gloo-ws4-bfloat16-max-async" in ids
    assert len(set(ids)) == 16
    inst = next(i for i in got if i.id == "gloo-ws4-int64-max-async")
    assert (inst.world_size, inst.dtype, inst.reduce_op, inst.async_op) == (4, "int64", "max", True)
    assert inst.key == "cases/x.yaml::m[gloo-ws4-int64-max-async]"


def test_non_reducing_ops_have_no_reduce_axis_and_args_appear_in_ids() -> None:
    got = instances("""
    cases:
      - name: b
        op: broadcast
        world_size: 3
        args: {src: [0, 2]}
        shape: [2]
        input: "rank"
    """)
    assert [i.id for i in got] == ["gloo-ws3-float32-sync-src0", "gloo-ws3-float32-sync-src2"]
    assert dict(got[1].steps[0].args) == {"src": 2}


def test_params_and_shape_axes() -> None:
    got = instances("""
    cases:
      - name: p
        op: all_gather
        params: {n: [0, 7]}
        shape: [n, 2]
        input: "i"
    """)
    assert [i.id for i in got] == ["gloo-ws2-float32-sync-n0", "gloo-ws2-float32-sync-n7"]
    out = next(t for t in got[1].tensors if t.name == "output")
    assert out.shape == (2, 7, 2)  # all_gather output: world_size chunks of the input


def test_backends_filter_and_default_device() -> None:
    text = """
    cases:
      - {name: g, op: barrier, backends: [gloo]}
    """
    assert instances(text, "nccl") == []
    assert instances(text, "gloo")[0].device == "cpu"
    assert instances("cases:\n  - {name: n, op: barrier}\n", "nccl")[0].device == "cuda"


OVERRIDES = """
cases:
  - name: o
    op: all_reduce
    reduce_op: [sum, avg]
    dtype: [float32, int64]
    shape: [2]
    input: "i"
    overrides:
      - when: {backend: gloo, reduce_op: avg}
        raises: "AVG"
        reason: Gloo has no AVG
      - when: {backend: gloo, torch: "<2.0", dtype: int64}
        xfail: true
        reason: old torch
        issue: https://example.invalid/1
      - when: {dtype: float32, reduce_op: sum}
        skip: true
        reason: not today
"""


def test_overrides_apply_by_axis_and_torch_version() -> None:
    by_id = {i.id: i for i in instances(OVERRIDES)}
    avg = overrides.resolve(by_id["gloo-ws2-int64-avg-sync"], "2.13.0+cpu")
    assert (avg.expectation.kind, avg.expectation.match) == ("raises", "AVG")
    assert avg.expectation.reason == "Gloo has no AVG"
    old = overrides.resolve(by_id["gloo-ws2-int64-sum-sync"], "1.13.1")
    assert old.expectation.xfail == "old torch (https://example.invalid/1)"
    new = overrides.resolve(by_id["gloo-ws2-int64-sum-sync"], "2.13.0")
    assert new.expectation.xfail == "" and new.expectation.kind == "pass"
    assert overrides.resolve(by_id["gloo-ws2-float32-sum-sync"], "2.13.0").expectation.skip
    nccl = {i.id: i for i in instances(OVERRIDES, "nccl")}
    assert overrides.resolve(nccl["nccl-ws2-int64-avg-sync"], "2.13.0").expectation.kind == "pass"


NCCL_SCOPED = """
cases:
  - name: n
    op: all_reduce
    dtype: [float32, bfloat16]
    shape: [2]
    input: "i"
    overrides:
      - when: {backend: nccl, nccl: ">=2.27", dtype: bfloat16}
        xfail: true
        reason: bf16 rounding on new NCCL
"""


def test_an_nccl_scoped_override_applies_only_within_its_nccl_versions() -> None:
    by_id = {i.id: i for i in instances(NCCL_SCOPED, "nccl")}
    bf16 = by_id["nccl-ws2-bfloat16-sum-sync"]
    assert overrides.resolve(bf16, "2.13.0", "2.28.9").expectation.xfail.startswith("bf16")
    assert not overrides.resolve(bf16, "2.13.0", "2.26.2").expectation.xfail
    # No NCCL in this torch: an NCCL-scoped override can never be taken as applying.
    assert not overrides.resolve(bf16, "2.13.0", "").expectation.xfail
    [miss] = overrides.not_applied(bf16, "2.13.0", "2.26.2")
    assert (miss["scope"], miss["when"]) == ("nccl", "NCCL >=2.27")
    assert not overrides.not_applied(by_id["nccl-ws2-float32-sum-sync"], "2.13.0", "2.26.2")


BY_VALUE = """
defaults:
  op: broadcast
  params: {m: [1]}
  shape: [2]
  input: "i"
  overrides:
    - when: {backend: gloo, args: {src: "world_size - 1"}}
      xfail: true
      reason: the last rank as the root
    - when: {backend: gloo, args: {src: "m + 1"}, world_size: 3}
      skip: true
      reason: a param in the expression
cases:
  - name: low
    world_size: [2, 3]
    args: {src: [0, 1]}
  - name: high
    world_size: 3
    args: {src: 2}
"""


def test_a_when_expression_of_the_world_size_matches_the_number_it_is_there() -> None:
    """Issue 43.8: the override matcher compared 'world_size - 1' with the instance's 2 as
    strings, so an override written for the last rank never applied to a case (or a
    generated instance) that names it by number."""
    got = {}
    for inst in instances(BY_VALUE):
        exp = overrides.resolve(inst, "2.13.0").expectation
        got[f"{inst.case}[{inst.id}]"] = (bool(exp.xfail), bool(exp.skip))
    assert got == {"low[gloo-ws2-float32-sync-src0]": (False, False),
                   "low[gloo-ws2-float32-sync-src1]": (True, False),
                   "low[gloo-ws3-float32-sync-src0]": (False, False),
                   "low[gloo-ws3-float32-sync-src1]": (False, False),
                   "high[gloo-ws3-float32-sync-src2]": (True, True)}


@pytest.mark.parametrize("key", ["torch", "nccl"])
def test_a_scope_that_is_not_a_version_specifier_fails_collection_at_its_line(key: str) -> None:
    text = NCCL_SCOPED.replace('nccl: ">=2.27"', f'{key}: "!=2.13.*, <99; python_version > \'3\'"')
    with pytest.raises(CaseFileError, match=f"when.{key} .* is not a version specifier") as exc:
        instances(text, "nccl")
    assert exc.value.pos.line == 9


def test_steps_form_builds_a_program() -> None:
    (inst,) = instances("""
    cases:
      - name: ring
        world_size: 3
        tensors:
          a: {shape: [2], init: "rank"}
          b: {shape: [2], init: poison}
        steps:
          - {op: isend, tensor: a, dst: "(rank + 1) % world_size", handle: s}
          - {op: irecv, tensor: b, src: "(rank - 1) % world_size", handle: r}
          - {wait: [s, r]}
        expected:
          b: "(rank - 1) % world_size"
    """)
    kinds = [s.kind for s in inst.steps]
    assert kinds == ["op", "op", "wait"]
    assert inst.steps[0].async_op and inst.steps[0].handle == "s"
    assert inst.steps[2].waits == ("s", "r")
    assert inst.shorthand is None and dict(inst.expected)["b"].kind == "expr"


def test_future_on_a_sync_op_is_an_error_not_a_silent_skip() -> None:
    # On a sync op the rank has no Work, so the future step would check nothing; the case's
    # async axis can make that happen in some instances only.
    text = """
    cases:
      - name: fut
        world_size: 2
        async: [true, false]
        tensors:
          t: {shape: [2], init: 1}
        steps:
          - {op: all_reduce, tensor: t, handle: h}
          - {future: h, tensor: t, expect: final}
          - {wait: h}
        expected:
          t: 2
    """
    try:
        instances(text)
    except CaseFileError as exc:
        msg = str(exc)
    else:
        raise AssertionError("a future on a sync op was accepted")
    assert "cases/x.yaml:10:18:" in msg and "future step on handle 'h'" in msg
    assert "synchronous here" in msg


def test_program_ids_say_sync_or_async_and_name_only_a_reduce_op_a_call_uses() -> None:
    # issue 26 point 7: a p2p-only program had no sync/async word; a case-level reduce op that
    # every reducing step overrides named instances after a reduction no call made.
    got = instances("""
    cases:
      - name: ring
        world_size: 2
        tensors:
          out: {shape: [2], init: "rank"}
          inp: {shape: [2], init: zeros}
        steps:
          - {op: isend, tensor: out, dst: "(rank + 1) % world_size", handle: s}
          - {op: irecv, tensor: inp, src: "(rank - 1) % world_size", handle: r}
          - {wait: [s, r]}
        expected: {inp: "(rank - 1) % world_size"}
      - name: own_ops
        world_size: 2
        tensors:
          x: {shape: [2], init: "rank + 1"}
          y: {shape: [2], init: "rank + 1"}
        steps:
          - {op: all_reduce, tensor: x, reduce_op: max}
          - {op: all_reduce, tensor: y, reduce_op: sum}
        expected: {x: 2, y: 3}
      - name: fsdp
        world_size: 2
        tensors:
          shard: {shape: [2], init: "rank"}
          full: {shape: ["2 * world_size"], init: poison}
        steps:
          - {op: all_gather_into_tensor, input: shard, output: full}
          - {op: reduce_scatter_tensor, input: full, output: shard}
        expected: {shard: "2 * rank"}
    """)
    by_case = {i.case: i for i in got}
    assert by_case["ring"].id == "gloo-ws2-float32-async"
    assert by_case["own_ops"].id == "gloo-ws2-float32-sync"
    assert by_case["own_ops"].reduce_op is None
    assert by_case["fsdp"].id == "gloo-ws2-float32-sum-sync"
    assert by_case["fsdp"].issued == (("all_gather_into_tensor", "all_gather"),
                                      ("reduce_scatter_tensor", "reduce_scatter"))
    assert by_case["ring"].issued == (("isend", "p2p"), ("irecv", "p2p"))
    assert by_case["own_ops"].issued == ()  # one distinct op: its op field says it all


def test_a_case_reduce_op_no_call_uses_is_an_error_at_its_line() -> None:
    text = case_error("""
    cases:
      - name: own_ops
        world_size: 2
        reduce_op: max
        tensors:
          x: {shape: [2], init: "rank + 1"}
        steps:
          - {op: all_reduce, tensor: x, reduce_op: sum}
        expected: {x: 3}
      - name: none_reduce
        world_size: 2
        reduce_op: [max, min]
        tensors:
          x: {shape: [2], init: "rank + 1"}
        steps:
          - {op: broadcast, tensor: x, src: 0}
        expected: {x: 1}
    """)
    assert ("cases/x.yaml:5:16: at cases[0].reduce_op: the case's reduce_op is used by no "
            "call: every reducing step names its own reduce_op") in text
    assert "cases/x.yaml:13:16: at cases[1].reduce_op: the case's reduce_op is used by no " \
           "call: no step of this program reduces" in text


RAISING_ROOT = """
cases:
  - name: r
    op: gather
    world_size: [2, 3]
    args: {dst: [0, "world_size - 1"]}
    shape: [2]
    input: "i"
    raises: {match: "x", ranks: [dst, "world_size - 1"], others: [blocked]}
"""


def test_raising_ranks_may_name_the_root_or_an_expression() -> None:
    """Issue 43.8: raises ranks were numbers only, so an override for 'the root raises' had
    to be written once per root and world size, and one missing (a middle root, world size
    4) left a known behaviour unexplained."""
    got = {i.id: i.expectation.ranks for i in instances(RAISING_ROOT)}
    assert got == {"gloo-ws2-float32-sync-dst0": (0, 1),
                   "gloo-ws2-float32-sync-dstworld_size-1": (1, 1),
                   "gloo-ws3-float32-sync-dst0": (0, 2),
                   "gloo-ws3-float32-sync-dstworld_size-1": (2, 2)}


@pytest.mark.parametrize(("ranks", "message"), [
    ('[root]', "cases/x.yaml:9:34: at cases[0].raises.ranks[0]: bad expression 'root': "
               "unknown name 'root'"),
    ('["world_size // 0"]', "at cases[0].raises.ranks: bad raises rank: division by zero"),
    ('["world_size / 2"]', "at cases[0].raises.ranks: bad raises rank: 'world_size / 2' is "
                           "not a rank here (1.0)"),
])
def test_a_bad_raising_rank_is_a_located_error(ranks: str, message: str) -> None:
    text = RAISING_ROOT.replace("[dst, \"world_size - 1\"]", ranks)
    with pytest.raises((CaseFileError, CaseFileErrors)) as exc:
        instances(text)
    assert message in str(exc.value)
