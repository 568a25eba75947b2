"""The verdict's cross-rank agreement check (the op table's ``agree``)."""

from __future__ import annotations

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.model import Instance, RankResult, TensorCheck
from harness.verdict.outcome import disagreements

CASES = """
cases:
  - name: ar
    op: all_reduce
    world_size: 3
    shape: [2]
    input: 1
    expected: unspecified
  - name: sub
    op: all_reduce
    world_size: 4
    args: {group: [1, 3]}
    shape: [2]
    input: 1
  - name: rs
    op: reduce_scatter_tensor
    world_size: 2
    shape: [4]
    input: 1
"""


def _instances() -> dict[str, Instance]:
    doc = yamlload.load_text(CASES, "agree.yaml")
    return {c.name: expand.expand(c, "gloo")[0] for c in validate.load_cases(doc)}


def _results(digests: dict[int, str], tensor: str) -> dict[int, RankResult]:
    return {r: RankResult(rank=r, status="ok",
                          checks=[TensorCheck(tensor=tensor, ok=True, expectation="auto",
                                              digest=d)])
            for r, d in digests.items()}


def test_identical_digests_agree() -> None:
    inst = _instances()["ar"]
    assert disagreements(inst, _results({0: "aa", 1: "aa", 2: "aa"}, "tensor")) == []


def test_a_rank_with_other_bytes_is_reported() -> None:
    inst = _instances()["ar"]
    lines = disagreements(inst, _results({0: "aa", 1: "bb", 2: "aa"}, "tensor"))
    assert len(lines) == 1 and "rank(s) 1 hold bb" in lines[0] and "0, 2 hold aa" in lines[0]


def test_only_group_members_must_agree() -> None:
    inst = _instances()["sub"]
    assert disagreements(inst, _results({0: "x", 1: "aa", 2: "y", 3: "aa"}, "tensor")) == []
    assert disagreements(inst, _results({0: "x", 1: "aa", 2: "y", 3: "cc"}, "tensor"))


def test_ops_whose_outputs_differ_per_rank_are_not_compared() -> None:
    inst = _instances()["rs"]
    assert disagreements(inst, _results({0: "aa", 1: "bb"}, "output")) == []


def test_agreement_is_checked_even_without_an_expected_value() -> None:
    """A rank run with ``expected: unspecified`` still records its digest for the check."""
    import torch.distributed as dist

    from harness.program.interpreter import RankEnv, run_instance

    single = expand.expand(validate.load_cases(yamlload.load_text(
        CASES.replace("world_size: 3", "world_size: 1"), "agree.yaml"))[0], "gloo")[0]
    assert single.expected[0][1].kind == "unspecified"
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        res = run_instance(single, RankEnv(rank=0, world_size=1, device="cpu"))
    finally:
        dist.destroy_process_group()
    assert res.status == "ok", res.traceback
    assert [(c.expectation, bool(c.digest)) for c in res.checks] == [("unspecified", True)]
