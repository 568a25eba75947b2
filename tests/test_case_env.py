"""``env:`` and ``pg_timeout:``: allow-list checks, the matrix axis, and the pool key.

That the variables really reach the ranks is shown by the bundled
``cases/env.yaml::detail_detects_collective_mismatch``, which raises only under DETAIL.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Instance
from harness.run.pool import PoolKey

from .helpers import run_pytest, write_case_file


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


def test_a_session_runs_the_instances_of_one_pool_together(tmp_path: Path) -> None:
    # Between two plain cases of the same world size, cases with an environment of their own
    # and a timeout of their own: the two pools kept (--max-pools 2) made the plain pool close
    # and start again. Sorted by the whole pool key, each pool's instances are together, so
    # no pool is needed again after it was closed.
    text = """
    cases:
      - {name: plain_a, op: all_reduce, world_size: 2, shape: [2], input: "i"}
      - {name: debug_info, op: all_reduce, world_size: 2, shape: [2], input: "i",
         env: {TORCH_DISTRIBUTED_DEBUG: INFO}}
      - {name: timed, op: all_reduce, world_size: 2, shape: [2], input: "i", pg_timeout: 30}
      - {name: debug_detail, op: all_reduce, world_size: 2, shape: [2], input: "i",
         env: {TORCH_DISTRIBUTED_DEBUG: DETAIL}}
      - {name: plain_b, op: all_reduce, world_size: 2, shape: [2], input: "i"}
    """
    proc = run_pytest(write_case_file(tmp_path, text), "c.yaml", "--collect-only", "-q",
                      "--no-report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = [ln.split("::")[1].split("[")[0] for ln in proc.stdout.splitlines()
             if ln.startswith("c.yaml::")]
    assert sorted(order) == sorted(["plain_a", "debug_info", "timed", "debug_detail",
                                    "plain_b"]), proc.stdout
    pools = [{"debug_info": "info", "debug_detail": "detail", "timed": "timed"}.get(n, "plain")
             for n in order]
    # Each pool's instances in one run: as many runs as pools.
    runs = [p for i, p in enumerate(pools) if i == 0 or pools[i - 1] != p]
    assert len(runs) == len(set(pools)) == 4, order
