"""The bundled case library: it loads, it covers the API and the axes, it documents itself.

These tests read the case files through the harness's own loader and expansion (no ranks are
started), so they are fast; the one subprocess test checks that CUDA/NCCL paths skip cleanly
on a machine without a GPU.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from pathlib import Path

import pytest

from harness import dtypes, ops
from harness.casefile import expand, overrides, validate
from harness.casefile import load as yamlload
from harness.model import Instance

from .helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "cases"
FILES = sorted(CASES.glob("*.yaml"))
REDUCING = ("all_reduce", "reduce", "reduce_scatter_tensor")
MOVING = ("broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter",
          "all_to_all", "all_to_all_single")
# torch.distributed names in __all__ that are not communication ops. set_timeout (torch 2.15)
# changes a group's timeout for later ops: a local setting that moves no data, so there is no
# result to check (README "Torch versions").
NOT_COMMUNICATION = re.compile(
    r"^(get_.*|is_.*|init_process_group|destroy_process_group|new_group|new_subgroups.*|"
    r"split_group|shrink_group|record_comm|supports_complex|default_pg_timeout|group|"
    r"reduce_op|set_timeout)$")
# Budget for the default (quick) run: about 70 s for 1,900 instances on the 2-core CI machine,
# about 3 minutes for 2,619 with the upstream-parity files (README "The bundled library");
# keep it well inside a few minutes. 3,400 since PyTorch's backend contract suites joined the
# quick run (cases/backend_contract.yaml, 582 instances: a certificate runs the quick library,
# and its transport matrices are upstream's own); 3,500 since the fault-tolerance matrix (a
# peer dies before, during and after each op family) and the contract's integer rows joined
# it; the time itself is ci/bench/bench_budgets.py's.
QUICK_BUDGET = 3500


@functools.cache
def instances(backend: str = "gloo") -> tuple[Instance, ...]:
    out: list[Instance] = []
    for path in FILES:
        doc = yamlload.load_file(str(path), f"cases/{path.name}")
        for case in validate.load_cases(doc):
            out.extend(expand.expand(case, backend))
    return tuple(out)


def quick() -> list[Instance]:
    # What `pytest cases/` runs: the long matrix and the perf sweep (--perf only) are out.
    return [i for i in instances() if "full" not in i.marks and "perf" not in i.marks]


def ops_used(inst: Instance) -> set[str]:
    return {s.op for s in inst.steps if s.op}


@pytest.mark.parametrize("backend", ["gloo", "nccl", "faulty"])
def test_every_case_file_loads_and_expands(backend: str) -> None:
    assert FILES, "no case files"
    assert instances(backend)


def test_the_op_table_covers_the_installed_torch_distributed_api() -> None:
    import torch.distributed.distributed_c10d as c10d

    public = {n for n in c10d.__all__ if n[0].islower() and callable(getattr(c10d, n, None))}
    communication = {n for n in public if not NOT_COMMUNICATION.match(n)}
    assert communication >= {"all_reduce", "send", "broadcast_object_list"}
    missing = communication - set(ops.ALL_OPS)
    assert not missing, f"torch.distributed has ops the op table lacks: {sorted(missing)}"


def test_the_op_table_knows_which_ops_the_installed_torch_has() -> None:
    """An op marked ``seen_from`` a version must exist from that version on, and an op without
    it on every supported torch: the skip reasons for a missing op stay true."""
    import torch
    import torch.distributed as dist
    from packaging.version import Version

    installed = Version(torch.__version__.split("+")[0])
    wrong = {name: op.seen_from for name, op in ops.ALL_OPS.items()
             if installed >= Version(op.seen_from or "2.4") and not op.available(dist)}
    assert not wrong, f"torch {installed} lacks ops the table says it has: {wrong}"


def test_a_missing_op_skips_with_the_reason() -> None:
    from harness.run import capabilities

    caps = capabilities.probe(())
    inst = next(i for i in instances() if i.op == "gather_single")
    missing = type("Dist", (), {"is_backend_available": staticmethod(lambda b: True)})()
    import torch

    older = capabilities.Capabilities.of_modules(caps.torch_version, 0, missing, torch)
    reason = older.skip_reason(inst)
    assert reason == (f"torch {caps.torch_version} has no torch.distributed.gather_single "
                      "(the harness has seen it from torch 2.15)")


def test_every_op_of_the_table_has_cases() -> None:
    used = set().union(*(ops_used(i) for i in instances()))
    assert set(ops.ALL_OPS) - used == set()


def test_every_family_has_its_own_file() -> None:
    names = {p.stem for p in FILES}
    assert names >= {"p2p", "broadcast", "scatter", "reduce", "gather", "all_reduce",
                     "all_gather", "reduce_scatter", "all_to_all", "barrier", "objects",
                     "coalesced", "subgroups", "errors", "dtypes"}


def test_every_dtype_meets_every_reduce_op_in_the_quick_run() -> None:
    all_dtypes = {d for d, info in dtypes.DTYPES.items() if info.kind != "object"}
    for op in REDUCING:
        seen = {(i.dtype, i.reduce_op) for i in quick() if i.op == op}
        want = {(d, r) for d in all_dtypes for r in dtypes.REDUCE_OPS}
        assert want - seen == set(), op
    for op in MOVING:
        assert all_dtypes <= {i.dtype for i in quick() if i.op == op}, op


def test_world_sizes_sizes_layouts_and_async_are_covered() -> None:
    by_op: dict[str, list[Instance]] = defaultdict(list)
    for i in instances():
        by_op[i.op].append(i)
    for op in (*REDUCING, *MOVING, "reduce_scatter"):
        insts = by_op[op]
        sized = op != "all_to_all"  # the list form's sizes are covered by all_to_all_single
        assert {1, 2, 3, 4, 8} <= {i.world_size for i in insts}, op
        assert {True, False} <= {i.async_op for i in insts}, op
        layouts = {dict(i.axes).get("layout") for i in insts}
        assert {"contiguous", "transposed", "strided"} <= layouts, op
        counts = {_numel(i) for i in insts}
        if sized:
            assert 0 in counts and 1 in counts and any(n % 2 and n > 1 for n in counts), op
        assert max(counts) * 4 >= 2**20, f"{op}: nothing crosses the backend's chunking"
    assert "channels_last" in {dict(i.axes).get("layout") for i in by_op["all_reduce"]}
    assert {True, False} <= {dict(i.axes).get("args.inplace") for i in
                             by_op["all_gather_into_tensor"]}
    assert {"concat", "stack"} <= {dict(i.axes).get("args.form") for i in
                                   by_op["reduce_scatter_tensor"]}


def _numel(inst: Instance) -> int:
    """Elements per rank's contribution: the smallest buffer of the instance."""
    sizes = []
    for spec in inst.tensors:
        n = 1
        for d in spec.shape_for(0) or ():
            assert isinstance(d, int)  # shapes are concrete after expansion
            n *= d
        sizes.append(n)
    return min(sizes)


def test_overrides_say_why_and_link_real_issues() -> None:
    seen = 0
    for inst in instances():
        for o in inst.overrides:
            seen += 1
            assert len(o.reason) > 20, f"{inst.key}: override without a real reason"
            assert not o.issue or o.issue.startswith("https://github.com/"), o.issue
            patch = dict(o.patch)
            assert {"raises", "xfail", "skip", "hangs", "crashes", "tolerance", "ordering",
                    "expected"} & set(patch), f"{inst.key}: override changes nothing"
    assert seen


def test_gloo_findings_are_recorded_as_limitations_or_failures() -> None:
    """The library keeps the contract and records Gloo's behaviour: rejected combinations
    as `raises`, silent divergences as `xfail` (never by weakening the expectation)."""
    kinds: dict[str, set[str]] = defaultdict(set)
    for inst in instances():
        resolved = overrides.resolve(inst, "2.13.0")
        exp = resolved.expectation
        if exp.xfail:
            kinds["xfail"].add(inst.op)
        elif exp.kind != "pass" and exp.reason:
            kinds[exp.kind].add(inst.op)
    assert {"all_reduce", "reduce", "scatter", "broadcast"} <= kinds["xfail"]
    assert {"all_reduce", "gather", "all_gather_into_tensor"} <= kinds["raises"]
    assert "crashes" in kinds


def test_the_quick_run_stays_within_budget_and_full_adds_the_long_matrix() -> None:
    q, everything = quick(), instances()
    assert 500 < len(q) <= QUICK_BUDGET
    assert len(everything) > 2 * len(q)
    assert all(i.world_size < 8 for i in q), "world size 8 belongs to the long matrix"


def test_cuda_and_nccl_instances_skip_cleanly_without_a_gpu(pytester: pytest.Pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the NCCL paths run instead of skipping")
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        str(CASES / "all_reduce.yaml"), str(CASES / "broadcast.yaml"), "--backend", "nccl",
        "-k", "reduce_ops or every_root or devices", "--report-json", str(report),
        "--report-md", str(pytester.path / "r.md"), "--rootdir", str(ROOT),
        "-p", "no:cacheprovider", "-rs", timeout=HANG_S)
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) > 20 and "passed" not in outcomes, outcomes
    assert "failed" not in outcomes and "error" not in outcomes, outcomes
    text = result.stdout.str()
    assert "not available in this torch build" in text or "no CUDA device" in text
    result = pytester.runpytest_subprocess(
        str(CASES / "all_reduce.yaml"), "-k", "devices and cuda", "--no-report",
        "--rootdir", str(ROOT), "-p", "no:cacheprovider", "-rs", timeout=HANG_S)
    assert result.parseoutcomes().get("skipped", 0) == 4
    assert "no CUDA device on this machine" in result.stdout.str()
