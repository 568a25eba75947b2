"""``env:`` and ``pg_timeout:``: allow-list checks, the matrix axis, and the pool key.

That the variables really reach the ranks is shown by the bundled
``cases/env.yaml::detail_detects_collective_mismatch``, which raises only under DETAIL.
"""

from __future__ import annotations

import textwrap

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Instance
from harness.run.pool import PoolKey


def instances(body: str, backend: str = "gloo") -> list[Instance]:
    text = textwrap.dedent("""
    cases:
      - name: e
        op: all_reduce
        world_size: 2
        shape: [3]
        input: "i"
    """) + textwrap.indent(textwrap.dedent(body), "    ")
    doc = yamlload.load_text(text, "cases/x.yaml")
    out: list[Instance] = []
    for case in validate.load_cases(doc):
        out.extend(expand.expand(case, backend))
    return out


def test_env_values_are_an_axis_and_reach_the_instance() -> None:
    insts = instances('env: {TORCH_DISTRIBUTED_DEBUG: ["OFF", DETAIL]}\npg_timeout: 7\n')
    assert [i.id for i in insts] == ["gloo-ws2-float32-sum-sync-TORCH_DISTRIBUTED_DEBUG=OFF",
                                     "gloo-ws2-float32-sum-sync-TORCH_DISTRIBUTED_DEBUG=DETAIL"]
    assert insts[1].env == (("TORCH_DISTRIBUTED_DEBUG", "DETAIL"),)
    assert insts[0].pg_timeout == 7.0
    (one,) = instances("env: {TORCH_GLOO_LAZY_INIT: 1}\nbackends: [gloo]\n")
    assert one.env == (("TORCH_GLOO_LAZY_INIT", "1"),) and one.pg_timeout is None


def test_env_and_timeout_are_part_of_the_pool_key() -> None:
    base = PoolKey("gloo", "cpu", 2)
    assert PoolKey("gloo", "cpu", 2, env=(("TORCH_GLOO_LAZY_INIT", "1"),)) != base
    assert PoolKey("gloo", "cpu", 2, pg_timeout_s=1.0) != base
    assert PoolKey("gloo", "cpu", 2, env=()) == base


@pytest.mark.parametrize(("body", "message"), [
    ("env: {PATH: /tmp}\n", "environment variable 'PATH' is not on the allow-list"),
    ("env: {TORCH_GLOO_LAZY_INIT: 1}\n", "TORCH_GLOO_LAZY_INIT applies to gloo only"),
    ("env: {TORCH_NCCL_NAN_CHECK: 1}\nbackends: [gloo, nccl]\n", "applies to nccl only"),
    ("env: {torch_debug: 1}\n", "'torch_debug' is not a valid name here"),
    ("pg_timeout: 0\n", "less than or equal to the minimum of 0"),
])
def test_bad_env_is_reported_at_its_line(body: str, message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(body)
    assert message in str(info.value) and "cases/x.yaml:" in str(info.value)


def test_nccl_variables_need_a_nccl_only_case() -> None:
    assert instances("env: {TORCH_NCCL_NAN_CHECK: 1}\nbackends: [nccl]\n") == []
    (inst,) = instances("env: {TORCH_NCCL_NAN_CHECK: 1}\nbackends: [nccl]\n", backend="nccl")
    assert inst.env == (("TORCH_NCCL_NAN_CHECK", "1"),)
