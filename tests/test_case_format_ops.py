"""Case-format pieces for specific ops: object buffers, split matrices, batches, per-rank shapes.

Each malformed file must fail at collection with a message naming the problem (never at run
time in a rank); well-formed ones must expand to what the ranks need.
"""

from __future__ import annotations

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Instance


def load(text: str) -> list[Instance]:
    doc = yamlload.load_text(text, "x.yaml")
    return [i for c in validate.load_cases(doc) for i in expand.expand(c, "gloo")]


def error_of(text: str) -> str:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        load(text)
    return str(info.value)


def test_split_matrix_must_match_the_group() -> None:
    msg = error_of("""
cases:
  - {name: a, op: all_to_all_single, world_size: 3, args: {splits: [[1, 2], [3, 4]]},
     shape: [0], input: 1}
""")
    assert "3x3 matrix" in msg and "x.yaml:3" in msg


def test_negative_and_malformed_splits_are_rejected_at_collection() -> None:
    assert "cannot be negative" in error_of("""
cases:
  - {name: a, op: all_to_all_single, world_size: 2, args: {splits: [[1, -2], [3, 4]]},
     shape: [0], input: 1}
""")
    assert "bad expression" in error_of("""
cases:
  - {name: a, op: all_to_all_single, world_size: 2, args: {splits: "src +* dst"},
     shape: [0], input: 1}
""")


def test_split_expression_gives_per_rank_shapes() -> None:
    (inst,) = load("""
cases:
  - {name: a, op: all_to_all_single, world_size: 2, args: {splits: "src + 2 * dst"},
     shape: [0, 3], input: 1}
""")
    assert dict(inst.steps[0].args)["splits"] == ((0, 2), (1, 3))
    inp, out = inst.tensors
    assert inp.rank_shapes == ((2, 3), (4, 3)) and out.rank_shapes == ((1, 3), (5, 3))


def test_object_fills_are_plain_data() -> None:
    (inst,) = load("""
cases:
  - {name: a, op: all_gather_object, world_size: 2,
     input: {0: "rank + 1", 1: {others: 5}}}
""")
    assert inst.dtype == "object" and "object" in inst.id
    fill = inst.tensors[0].init
    assert fill.for_rank(0).data == "rank + 1"  # a string, not an expression
    assert fill.for_rank(1).data == {"others": 5}  # nested maps are data


def test_object_buffers_take_only_the_objects_generator() -> None:
    assert "'objects' generator" in error_of("""
cases:
  - {name: a, op: all_gather_object, world_size: 2, input: {generator: exact}}
""")
    assert "is for object buffers" in error_of("""
cases:
  - {name: a, op: all_reduce, world_size: 2, shape: [3], input: {generator: objects}}
""")


def test_object_ops_need_object_buffers_in_programs() -> None:
    msg = error_of("""
cases:
  - name: a
    world_size: 2
    tensors: {t: {shape: [2], init: 0}}
    steps:
      - {op: send_object_list, objects: t, dst: 1, ranks: [0]}
    expected: {}
""")
    assert "holds Python objects" in msg and "dtype: object" in msg


def test_batches_name_declared_tensors() -> None:
    assert "unknown tensor 'nope'" in error_of("""
cases:
  - name: a
    world_size: 2
    tensors: {t: {shape: [2], init: 0}}
    steps:
      - op: batch_isend_irecv
        p2p: [{op: isend, tensor: nope, peer: 1}]
    expected: {}
""")
    assert "needs 'p2p:'" in error_of("""
cases:
  - name: a
    world_size: 2
    tensors: {t: {shape: [2], init: 0}}
    steps:
      - {op: batch_isend_irecv}
    expected: {}
""")


def test_batch_entries_become_roles_and_arguments() -> None:
    (inst,) = load("""
cases:
  - name: a
    world_size: 2
    tensors: {a: {shape: [2], init: 0}, b: {shape: [2], init: poison}}
    steps:
      - op: batch_isend_irecv
        p2p:
          - {op: isend, tensor: a, peer: "1 - rank", tag: 4}
          - {op: irecv, tensor: b, peer: "1 - rank", tag: 4}
    expected: {b: 0}
""")
    step = inst.steps[0]
    assert step.bufs == (("p2p.0", "a"), ("p2p.1", "b"))
    args = dict(step.args)
    assert args["p2p.0.op"] == "isend" and args["p2p.1.tag"] == 4
    assert args["p2p.1.peer"]({"rank": 0, "world_size": 2}) == 1


def test_shapes_may_depend_on_the_rank() -> None:
    (inst,) = load("""
cases:
  - name: a
    world_size: 3
    tensors: {t: {shape: ["2 + rank"], init: 0}}
    steps:
      - {op: all_reduce, tensor: t}
    expected: {t: 0}
""")
    assert inst.tensors[0].rank_shapes == ((2,), (3,), (4,))


def test_form_and_inplace_are_axes_with_readable_ids() -> None:
    ids = {i.id for i in load("""
cases:
  - {name: a, op: all_gather_into_tensor, world_size: 2, shape: [2],
     args: {form: [concat, stack], inplace: [false, true]}, input: 1}
""")}
    assert "gloo-ws2-float32-sync-stack-inplace" in ids
    assert "gloo-ws2-float32-sync-concat-outofplace" in ids
