"""The process-group methods (``pg.*`` ops): reference models, case-file errors, real runs.

The reference models are called directly on hand-made inputs; the case-file errors go
through the loader and expansion (no ranks); one pytester run executes a small case file on
Gloo and reads the JSON report, so the op calls, the nested name lists, ``via: backend`` and
the root-only output all meet real process groups.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import ops
from harness.model import pack_tensor_list, tensor_list, tensor_names
from harness.ops import RefContext
from tests.helpers import HANG_S
from tests.helpers import case_error as problems
from tests.helpers import case_instances as instances

ROOT = Path(__file__).resolve().parent.parent


def ctx(ws: int, reduce_op: str | None = None, **args: Any) -> RefContext:
    return RefContext(world_size=ws, group_ranks=tuple(range(ws)), reduce_op=reduce_op,
                      args={"premul_factor": 2.0, **args}, out_shape=())


# -- reference models -----------------------------------------------------------------------

def test_allreduce_reduces_every_tensor_of_every_rank_into_every_entry() -> None:
    # upstream's simple_multi_input_reduce_tests: rank r holds [2r + 1], [2r + 2]
    inputs = [torch.tensor([[2.0 * r + 1], [2.0 * r + 2]]) for r in range(3)]
    op = ops.get("pg.allreduce")
    assert [t.tolist() for t in op.reference(inputs, ctx(3, "sum"))] == [[[21.0], [21.0]]] * 3
    assert op.reference(inputs, ctx(3, "product"))[1].tolist() == [[720.0], [720.0]]
    assert op.reference(inputs, ctx(3, "min"))[2].tolist() == [[1.0], [1.0]]
    assert op.reference(inputs, ctx(3, "max"))[0].tolist() == [[6.0], [6.0]]


def test_broadcast_sends_the_root_tensor_of_the_root_rank_to_every_entry() -> None:
    inputs = [torch.tensor([[2.0 * r], [2.0 * r + 1]]) for r in range(2)]
    op = ops.get("pg.broadcast")
    got = op.reference(inputs, ctx(2, root_rank=1, root_tensor=1))
    assert [t.tolist() for t in got] == [[[3.0], [3.0]], [[3.0], [3.0]]]
    got = op.reference(inputs, ctx(2, root_rank=0, root_tensor=1))
    assert got[1].tolist() == [[1.0], [1.0]]
    with pytest.raises(ValueError, match="root_rank 2 is outside the group"):
        op.reference(inputs, ctx(2, root_rank=2))
    with pytest.raises(ValueError, match="root_tensor 2 is outside the root's list of 2"):
        op.reference(inputs, ctx(2, root_rank=0, root_tensor=2))


def test_reduce_defines_the_root_entry_only() -> None:
    inputs = [torch.tensor([[r + 1.0], [10.0 * r]]) for r in range(3)]
    got = ops.get("pg.reduce").reference(inputs, ctx(3, "sum", root_rank=2, root_tensor=0))
    assert got[0] is None and got[1] is None
    assert got[2].tolist() == [[6.0], [20.0]]  # entry 1 keeps the root's input


def test_allgather_puts_input_i_of_member_m_at_n_m_plus_i_of_every_list() -> None:
    n = 3
    inputs = [torch.tensor([[float(n * r + i)] for i in range(n)]) for r in range(2)]
    op = ops.get("pg.allgather")
    got = op.reference(inputs, ctx(2))
    assert got[1].shape == op.out_shape((n, 1), 2) == (3, 6, 1)
    assert got[1].reshape(n, -1).tolist() == [[float(k) for k in range(6)]] * n


def test_gather_and_scatter_address_the_root_by_group_position() -> None:
    inputs = [torch.tensor([[float(r)]]) for r in range(3)]
    got = ops.get("pg.gather").reference(inputs, ctx(3, root_rank=1))
    assert got[0] is None and got[2] is None and got[1].tolist() == [[[0.0], [1.0], [2.0]]]
    src = torch.arange(6, dtype=torch.float32).reshape(1, 3, 2)
    got = ops.get("pg.scatter").reference([None, None, src], ctx(3, root_rank=2))
    assert [t.tolist() for t in got] == [[[0.0, 1.0]], [[2.0, 3.0]], [[4.0, 5.0]]]


def test_coalesced_tensor_methods_handle_entries_of_different_shapes() -> None:
    mine = [[torch.full((j + 1, 2), float(10 * r + j)) for j in range(2)] for r in range(2)]
    got = ops.get("pg.allgather_into_tensor_coalesced").reference(mine, ctx(2))
    assert isinstance(got[0], list)
    assert got[0][1][:, 0].tolist() == [1.0, 1.0, 11.0, 11.0]
    big = [[torch.arange(4.0 * (j + 1)).reshape(2 * (j + 1), 2) + r for j in range(2)]
           for r in range(2)]
    out = ops.get("pg.reduce_scatter_tensor_coalesced").reference(big, ctx(2, "sum"))
    assert out[1][0].tolist() == [[5.0, 7.0]]  # chunk 1 of (x + x + 1), x = [[2, 3]]
    layouts = ops.get("pg.reduce_scatter_tensor_coalesced").entry_layouts(
        lambda s, j: (5 * (j + 1), 5 * (j + 1)), 3, 2)
    assert layouts is not None and layouts[0] == ([(15, 5), (30, 10)], [(5, 5), (10, 10)])


def test_nested_name_lists_pack_and_unpack() -> None:
    items: list[str | list[str]] = ["a", ["b", "c"], []]
    packed = pack_tensor_list(items)
    assert tensor_list(packed) == items
    assert tensor_names(packed) == ["a", "b", "c"]
    assert tensor_list(pack_tensor_list([])) == []


# -- case-file errors -----------------------------------------------------------------------

def test_steps_take_nested_lists_and_the_pg_arguments() -> None:
    insts = instances("""
        cases:
          - name: ok
            world_size: 2
            tensors:
              x: {shape: [1], init: 0}
              o: {shape: [1], init: 0}
            steps:
              - {op: pg.gather, output: [[o, o]], input: [x], root_rank: "rank % 2",
                 via: backend, options: int}
            expected: {}
            raises: "."
        """)
    step = insts[0].steps[0]
    assert tensor_list(dict(step.bufs)["output"]) == [["o", "o"]]
    args = dict(step.args)
    assert args["via"] == "backend" and args["options"] == "int"
    assert args["root_rank"]({"rank": 3, "world_size": 2}) == 1


def test_pg_argument_mistakes_fail_collection_at_their_line() -> None:
    text = problems("""
        cases:
          - name: bad
            world_size: 2
            tensors:
              x: {shape: [1], init: 0}
            steps:
              - {op: pg.allreduce, tensors: [[x]], options: int}
              - {op: pg.allreduce, tensors: [x], root_rank: 0}
              - {op: pg.broadcast, tensors: [x], root_rank: "rank +", options: overload}
              - {op: pg.gather, output: [[x, y]], input: [x]}
            expected: {}
        """)
    assert "cases/x.yaml:8:" in text and "is a list of tensors, not a list of lists" in text
    assert "pg.allreduce takes no options form 'int'" in text and "allowed here: object" in text
    assert "cases/x.yaml:9:" in text and "pg.allreduce takes no argument 'root_rank'" in text
    assert "cases/x.yaml:10:" in text and "bad expression 'rank +'" in text
    assert "cases/x.yaml:11:" in text and "unknown tensor 'y'" in text


def test_pg_argument_values_are_checked_by_the_schema() -> None:
    text = problems("""
        cases:
          - name: bad
            op: pg.broadcast
            args: {via: backned, root_rank: 0}
            shape: [1, 1]
            input: 0
        """)
    assert "cases/x.yaml:5:" in text and "'backned' is not allowed" in text
    assert "did you mean 'backend'?" in text
    text = problems("""
        cases:
          - name: bad
            world_size: 2
            steps:
              - {wait: h, root_tensor: 1}
        """)
    assert "'root_tensor' does not apply to a wait step" in text


def test_the_one_tensor_overload_takes_one_tensor_and_no_root_tensor() -> None:
    text = problems("""
        cases:
          - name: bad
            op: pg.broadcast
            args: {root_rank: 0, root_tensor: 0, options: overload}
            shape: [2, 1]
            input: 0
        """)
    assert "cases/x.yaml:5:" in text and "the one-tensor overload takes no rootTensor" in text
    assert "the list holds 2" in text
    text = problems("""
        cases:
          - name: bad
            world_size: 2
            tensors:
              x: {shape: [1], init: 0}
            steps:
              - {op: pg.reduce, tensors: [x, x], root_rank: 0, options: overload}
            expected: {}
        """)
    assert "cases/x.yaml:8:" in text and "the list holds 2" in text



def test_allreduce_omits_the_op_only_in_the_one_tensor_overload() -> None:
    # Upstream checks pg.allreduce(x) defaults to SUM; the list forms take options, where an
    # omitted op would silently become the options' default instead.
    text = problems("""
        cases:
          - name: bad
            op: pg.allreduce
            args: {omit: [reduce_op]}
            shape: [2, 1]
            input: 0
        """)
    assert "cases/x.yaml:5:" in text
    assert "pg.allreduce leaves out the reduce op only in its one-tensor overload" in text
    (good,) = instances("""
        cases:
          - name: good
            op: pg.allreduce
            world_size: 2
            args: {omit: [reduce_op], options: overload}
            shape: [1, 1]
            input: 0
        """)
    assert dict(good.steps[0].args)["omit"] == ("reduce_op",)


def test_a_root_rank_axis_names_the_instances() -> None:
    insts = instances("""
        cases:
          - name: roots
            op: pg.reduce
            world_size: 3
            args: {root_rank: [0, "world_size - 1"], root_tensor: 0}
            shape: [1, 1]
            input: "rank"
        """)
    assert [i.id for i in insts] == ["gloo-ws3-float32-sum-sync-root_rank0-root_tensor0",
                                     "gloo-ws3-float32-sum-sync-root_rankworld_size-1-"
                                     "root_tensor0"]


def test_the_ordering_probes_delay_the_rank_the_others_depend_on() -> None:
    from harness.ordering.plan import delayed_rank

    def delayed(op: str, root: int) -> int:
        inst = instances(f"""
            cases:
              - name: c
                op: {op}
                world_size: 3
                async: true
                args: {{root_rank: {root}}}
                shape: [1, 3, 1]
                input: 0
            """)[0]
        return delayed_rank(inst)

    assert delayed("pg.broadcast", 1) == 1  # the root feeds everyone
    assert delayed("pg.scatter", 0) == 0
    assert delayed("pg.gather", 2) == 1  # the root collects: delay a contributor
    assert delayed("pg.reduce", 1) == 2


# -- a real run -----------------------------------------------------------------------------

CASES = """
defaults:
  world_size: 2
cases:
  - name: allreduce_auto
    op: pg.allreduce
    shape: [2, 1]
    input: "2 * rank + j"
  - name: allreduce_wrong_expectation
    op: pg.allreduce
    shape: [2, 1]
    input: "2 * rank + j"
    expected: 5
  - name: broadcast_root_tensor
    op: pg.broadcast
    args: {root_rank: 1, root_tensor: 1}
    shape: [2, 1]
    input: "2 * rank + j"
    expected: 3
  - name: gather_root_1
    op: pg.gather
    args: {root_rank: 1}
    shape: [1, 3]
    input: "rank * 10 + i"
  - name: gather_empty_input_on_the_backend
    tensors:
      o: {shape: [1], init: 0}
    steps:
      - {op: pg.gather, output: [[o, o]], input: [], root_rank: 0, via: backend}
    expected: {}
    raises: "RuntimeError: ProcessGroupGloo::gather: requires a single-element input tensor list"
  - name: gather_output_on_non_root
    tensors:
      x: {shape: [1], init: 0}
    steps:
      - {op: pg.gather, output: [[x, x]], input: [x], root_rank: "(rank + 1) % world_size"}
    expected: {}
    raises: "requires empty output on non-root"
  - name: coalesced_shapes
    op: pg.allgather_into_tensor_coalesced
    entries: 2
    entry_shape: ["j + 1", 2]
    input: "rank * 100 + i"
"""


def test_a_small_case_file_runs_on_gloo(pytester: pytest.Pytester,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    path = pytester.path / "pg.yaml"
    path.write_text(CASES)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        str(path), "--deadline", "30", "--report-json", str(report),
        "--report-md", str(pytester.path / "report.md"), "-p", "no:cacheprovider",
        "--rootdir", str(ROOT), "-q", timeout=HANG_S)
    assert report.exists(), result.stdout.str()[-3000:]
    records = {r["case"]: r for r in json.loads(report.read_text())["records"]}
    outcomes = {case: r["outcome"] for case, r in records.items()}
    assert outcomes == {
        "allreduce_auto": "passed", "allreduce_wrong_expectation": "failed",
        "broadcast_root_tensor": "passed", "gather_root_1": "passed",
        "gather_empty_input_on_the_backend": "passed", "gather_output_on_non_root": "passed",
        "coalesced_shapes": "passed"}, result.stdout.str()[-3000:]
    # The reference model was compared, and the non-root's gather output was left untouched.
    checks = {(c["tensor"], c["expectation"]) for rk in records["allreduce_auto"]["ranks"]
              for c in rk["checks"]}
    assert ("tensors", "auto") in checks
    gather = {rk["rank"]: {c["tensor"]: c["expectation"] for c in rk["checks"]}
              for rk in records["gather_root_1"]["ranks"]}
    assert gather[1]["output"] == "auto" and gather[0]["output"] == "untouched"
    assert "expected 5" in records["allreduce_wrong_expectation"]["message"]
