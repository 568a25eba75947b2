"""An override's ``expected:`` patches programs (the steps form) too, per tensor name."""

from __future__ import annotations

import textwrap

import pytest

from harness.casefile import expand, overrides, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Instance

CASE = """
cases:
  - name: p
    world_size: 2
    params: {n: [3]}
    tensors:
      t: {shape: [4], init: "rank + 1"}
      u: {shape: [2], init: 5}
      v: {shape: [2], init: 0}
    steps:
      - {op: all_reduce, tensor: t}
    expected:
      t: 3
      u: unchanged
    overrides:
      - when: {backend: gloo}
        expected: {t: {0: 3, others: "rank * 100 + n"}, v: unspecified}
        reason: a patch of two tensors of a program, one the case left without expectation
"""


def _instance(text: str = CASE) -> Instance:
    doc = yamlload.load_text(textwrap.dedent(text), "cases/x.yaml")
    return expand.expand(validate.load_cases(doc)[0], "gloo")[0]


def test_an_override_patches_the_named_tensors_of_a_program() -> None:
    inst = overrides.resolve(_instance(), "2.13.0")
    got = dict(inst.expected)
    t = got["t"]
    assert t.kind == "per_rank" and t.for_rank(0).data == 3
    expr = t.for_rank(1)
    assert expr.kind == "expr" and expr.data({"rank": 1, "n": 3, "world_size": 2}) == 103
    assert got["u"].kind == "unchanged"  # not named by the override: as the case says
    assert got["v"].kind == "unspecified"


def test_an_override_that_does_not_match_leaves_the_program_alone() -> None:
    inst = _instance(CASE.replace("{backend: gloo}", "{backend: nccl}"))
    assert dict(overrides.resolve(inst, "2.13.0").expected)["t"].data == 3


def test_the_patched_expectation_is_what_a_rank_checks() -> None:
    """End to end in one rank: the case's own expectation fails, the override's passes."""
    import torch.distributed as dist

    from harness.program.interpreter import RankEnv, run_instance

    text = """
    cases:
      - name: p
        world_size: 1
        tensors:
          t: {shape: [2], init: 1}
        steps:
          - {op: all_reduce, tensor: t}
        expected: {t: 2}
        overrides:
          - when: {backend: gloo}
            expected: {t: 1}
            reason: one rank sums to its own value (the case's 2 is wrong on purpose)
    """
    inst = _instance(text)
    dist.init_process_group("gloo", store=dist.HashStore(),  # type: ignore[attr-defined]
                            rank=0, world_size=1)
    try:
        plain = run_instance(inst, RankEnv(rank=0, world_size=1, device="cpu"))
        patched = run_instance(overrides.resolve(inst, "2.13.0"),
                               RankEnv(rank=0, world_size=1, device="cpu"))
    finally:
        dist.destroy_process_group()
    assert [c.ok for c in plain.checks] == [False]
    assert [c.ok for c in patched.checks] == [True]


@pytest.mark.parametrize(("patch", "message"), [
    ("expected: {w: 1}", "unknown tensor 'w'"),
    ("expected: 3", "with 'steps', expected maps tensor names to values"),
    ("expected: {t: \"rank + nope\"}", "unknown name 'nope'"),
    ("expected: {t: poison}", "'poison' cannot be used here"),
])
def test_a_bad_override_expectation_of_a_program_fails_collection(patch: str,
                                                                  message: str) -> None:
    text = CASE.replace('expected: {t: {0: 3, others: "rank * 100 + n"}, v: unspecified}',
                        patch)
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        _instance(text)
    assert message in str(info.value) and "cases/x.yaml:17" in str(info.value), str(info.value)
