"""Sparse COO buffers (``layout: sparse_coo``): case-file errors, the rank-side build and
comparison, and real Gloo runs whose verdicts depend on the dense form of the result."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError
from harness.program import interpreter, tensors
from tests.helpers import case_error as error_text
from tests.helpers import case_instances as instances
from tests.helpers import load_report

pytest_plugins = ["pytester"]


SHORTHAND = """
cases:
  - name: s
    op: {op}
    world_size: 2
    layout: {layout}
    {sparse}
    shape: [3, 2]
    input: "rank"
"""


def test_sparse_spec_reaches_the_buffers() -> None:
    (inst,) = instances(SHORTHAND.format(op="all_reduce", layout="sparse_coo",
                                         sparse="sparse: {sparse_dim: 1, uncoalesced: true}"))
    (spec,) = inst.tensors
    assert spec.layout == "sparse_coo" and spec.sparse is not None
    assert spec.sparse.sparse_dim == 1 and spec.sparse.uncoalesced
    (dense,) = instances(SHORTHAND.format(op="all_reduce", layout="contiguous", sparse=""))
    assert dense.tensors[0].sparse is None


@pytest.mark.parametrize(("op", "layout", "sparse", "where", "message"), [
    ("all_reduce", "contiguous", "sparse: {sparse_dim: 1}", "cases/x.yaml:7:13",
     "'sparse' describes a sparse COO buffer, but the case's layout is not sparse_coo"),
    ("all_gather", "sparse_coo", "", "cases/x.yaml:6:13",
     "layout sparse_coo needs buffers that are single tensors; all_gather takes lists"),
    ("all_reduce", "sparse_coo", "sparse: {sparse_dim: 3}", "cases/x.yaml:7:26",
     "sparse_dim 3 exceeds the 2 dim(s) of shape [3, 2]"),
    ("all_reduce", "sparse_coo", "sparse: {sparse_dim: 0}", "cases/x.yaml:7:26",
     "0 is less than the minimum of 1"),
    ("all_reduce", "sparse_coo", "sparse: {coalesce: true}", "cases/x.yaml:7:14",
     "coalesce"),
    ("all_reduce", "sparse_csr", "", "cases/x.yaml:6:13", "sparse_csr"),
])
def test_bad_sparse_keys_are_reported_at_their_position(op: str, layout: str, sparse: str,
                                                       where: str, message: str) -> None:
    text = error_text(SHORTHAND.format(op=op, layout=layout, sparse=sparse))
    assert where in text and message in text, text


PROGRAM = """
cases:
  - name: p
    world_size: 2
    tensors:
      s: {{shape: [2, 2], layout: sparse_coo, init: "rank"}}
      d: {{shape: [2, 2], init: 0}}
    steps:
      - {step}
    expected: {{d: 0}}
"""


def test_a_sparse_tensor_is_not_split_into_list_entries() -> None:
    text = error_text(PROGRAM.format(step="{op: all_gather, input: d, output: s}"))
    assert "cases/x.yaml:9:44" in text
    assert "the sparse tensor 's' cannot be split into entries" in text
    # As one entry of a list of tensors it is fine (the coalesced ops' dense+sparse checks).
    (inst,) = instances(PROGRAM.format(step="{op: all_reduce_coalesced, tensors: [d, s]}"))
    assert {t.name: t.sparse is not None for t in inst.tensors} == {"s": True, "d": False}


def test_object_buffers_cannot_be_sparse() -> None:
    text = error_text("""
    cases:
      - name: p
        world_size: 2
        tensors:
          o: {dtype: object, layout: sparse_coo, shape: [1], init: {others: [1]}}
        steps:
          - {op: broadcast_object_list, objects: o, src: 0}
    """)
    assert "object buffer 'o' cannot be sparse" in text and "cases/x.yaml:6:18" in text
    assert "1 problem(s)" in text  # not also "cannot be split into entries"


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_uncoalesced_buffers_hold_duplicates_that_sum_to_the_fill(dtype: torch.dtype) -> None:
    dense = torch.tensor([[0, 3, 0], [5, 0, 7]]).to(dtype)
    sp = tensors.to_sparse(dense, None, uncoalesced=True)
    assert sp.layout == torch.sparse_coo and not sp.is_coalesced()
    assert sp._nnz() == 2 * int((dense != 0).sum())
    assert torch.equal(sp.to_dense(), dense)
    rows = tensors.to_sparse(dense, 1, uncoalesced=False)
    assert rows.sparse_dim() == 1 and rows.dense_dim() == 1 and rows.is_coalesced()
    assert torch.equal(rows.to_dense(), dense)


def test_sparse_results_are_compared_in_dense_form() -> None:
    exp = torch.tensor([0.0, 2.0, 0.0, 4.0])
    got = tensors.to_sparse(exp, None, uncoalesced=True)
    assert tensors.compare("s", got, exp, "auto", None).ok
    assert tensors.digest(got) == tensors.digest(exp)
    wrong = tensors.compare("s", tensors.to_sparse(exp / 2, None, False), exp, "auto", None)
    assert not wrong.ok and wrong.wrong == 2 and wrong.first_wrong[0][0] == 1


def _rank0_checks(buf: torch.Tensor) -> list[Any]:
    (inst,) = instances("""
    cases:
      - name: p
        world_size: 2
        tensors:
          s: {shape: [3], layout: sparse_coo, init: "rank + i"}
        steps:
          - {op: all_reduce, tensor: s}
        expected:
          s: "2 * i + 1"
    """)
    renv = interpreter.RankEnv(rank=0, world_size=2, device="cpu")
    return interpreter.check_results(inst, renv, {}, {"s": buf},
                                     {"s": torch.tensor([0.0, 1.0, 2.0])}, {"s"})


def test_a_sparse_buffer_must_come_back_sparse() -> None:
    right = torch.tensor([1.0, 3.0, 5.0])
    (ok,) = _rank0_checks(tensors.to_sparse(right, None, False))
    assert ok.ok
    (densified,) = _rank0_checks(right.clone())
    assert not densified.ok and "declared sparse_coo, came back torch.strided" in densified.note


CASES = """
cases:
  - name: sum
    op: all_reduce
    world_size: [2, 3]
    layout: sparse_coo
    sparse: {uncoalesced: true}
    shape: [3, 2]
    input: "1 if j <= rank else 0"
  - name: sum_wrong_expectation
    op: all_reduce
    world_size: 2
    layout: sparse_coo
    shape: [4]
    input: "1 if i <= rank else 0"
    expected: "1 if i <= 1 else 0"
  - name: max_rejected
    op: all_reduce
    world_size: 2
    layout: sparse_coo
    reduce_op: max
    shape: [4]
    input: "rank"
    expected: unspecified
    raises: "unsupported reduction operation"
"""


def test_gloo_sums_sparse_tensors_and_a_wrong_expectation_fails(
        pytester: pytest.Pytester) -> None:
    (pytester.path / "sparse.yaml").write_text(textwrap.dedent(CASES))
    res = pytester.runpytest("sparse.yaml", "-q", "-p", "no:randomly")
    res.assert_outcomes(passed=3, failed=1)
    report = load_report(pytester.path / "reports" / "conformance.json")
    by_case = {r["case"]: r for r in report["records"]}
    bad = by_case["sum_wrong_expectation"]
    assert bad["outcome"] == "failed"
    # ranks 0 and 1 contribute 1 at index 0, rank 1 at index 1: index 0 holds 2, not 1
    assert "2" in bad["message"] and "tensor" in bad["message"]


def test_the_byte_limit_counts_indices_and_duplicates() -> None:
    from harness.casefile import sparse
    from harness.casefile.limits import Limits
    from harness.model import SparseSpec

    # int8 [4, 4, 4], every dim sparse, uncoalesced: 64 dense bytes + 128 values + 128 entries
    # x 3 indices x 8 bytes.
    assert sparse.bytes_bound((4, 4, 4), 1, SparseSpec(None, True)) == 64 + 128 + 128 * 24
    assert sparse.bytes_bound((4, 4, 4), 1, SparseSpec(1, False)) == 64 + 64 + 4 * 8
    text = """
    cases:
      - name: s
        op: all_reduce
        world_size: 2
        dtype: int8
        layout: {layout}
        sparse: {{uncoalesced: true}}
        shape: [4, 4, 4]
        input: 1
    """
    limits = Limits(buffer_bytes=1024)
    doc = yamlload.load_text(textwrap.dedent(text.format(layout="[sparse_coo]")),
                             "cases/x.yaml")
    (case,) = validate.load_cases(doc)
    with pytest.raises(CaseFileError) as info:
        expand.expand(case, "gloo", limits)
    assert ("buffer 'tensor' of shape [4, 4, 4] (int8, sparse_coo: dense fill and indices) "
            "takes up to 3264 bytes per rank; the limit is 1024") in str(info.value)
    # The same buffer dense is well inside the limit.
    dense = validate.load_cases(yamlload.load_text(textwrap.dedent(
        text.format(layout="contiguous").replace("        sparse: {uncoalesced: true}\n", "")),
        "cases/x.yaml"))
    assert expand.expand(dense[0], "gloo", limits)


def test_future_result_snapshots_the_futures_one_tensor() -> None:
    from harness.program.timeline import future_tensor

    t = torch.ones(2)
    assert future_tensor([t]) is t and future_tensor(t) is t
    with pytest.raises(RuntimeError, match="the future's value is a list of 2; 'result' "
                       "needs one tensor"):
        future_tensor([t, t])
    with pytest.raises(RuntimeError, match="is a NoneType"):
        future_tensor(None)
    u = torch.zeros(2)
    assert future_tensor([t, u], 1) is u and future_tensor([t], 0) is t
    with pytest.raises(RuntimeError, match="list of 2; 'result' needs a list with a tensor at "
                       "index 2"):
        future_tensor([t, u], 2)


@pytest.mark.parametrize(("step", "where", "message"), [
    ("{read: d, result: true}", "10:27", "'result' does not apply to a read step"),
    ("{future: h, result: true}", "10:9", "'result' on a future step needs 'tensor: NAME'"),
])
def test_bad_future_result_is_reported_at_its_position(step: str, where: str,
                                                      message: str) -> None:
    text = error_text(PROGRAM.format(step="{op: all_reduce, tensor: s, async: true, handle: h}"
                                     "\n      - " + step))
    assert f"cases/x.yaml:{where}:" in text and message in text, text


def test_future_result_reaches_the_step() -> None:
    (inst,) = instances(PROGRAM.format(
        step="{op: all_reduce, tensor: s, async: true, handle: h}\n"
             "      - {future: h, tensor: s, result: true, expect: final}"))
    assert dict(inst.steps[1].args) == {"result": True}
    (second,) = instances(PROGRAM.format(
        step="{op: all_reduce, tensor: s, async: true, handle: h}\n"
             "      - {future: h, tensor: s, result: 0, expect: final}"))
    assert dict(second.steps[1].args) == {"result": 0}
