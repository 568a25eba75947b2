"""Guard regions around the buffers the harness allocates (issue 42, point 1).

The unit tests read a guarded allocation directly; the end-to-end ones run the mutant that
writes one element past the end of every collective's output: the guard catches it, and
with ``guard: 0`` (the old allocation, nothing after the buffer) it survives, so the guard
is what kills it. A correct backend (Gloo) passes with guards on every kind of buffer.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.model import TensorSpec
from harness.mutate.backend import write_past_end
from harness.program import guards, tensors
from tests.helpers import case_error, case_instances, load_report, run_pytest, write_case_file


def _guarded(t: torch.Tensor, g: int = 64) -> tuple[torch.Tensor, guards.Watch]:
    watch = guards.Watch()
    view, region = guards.wrap("out", t, g)
    assert region is not None
    watch.regions["out"] = region
    return view, watch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int8, torch.complex128])
def test_a_guarded_buffer_keeps_values_shape_and_alignment(dtype: torch.dtype) -> None:
    t = tensors.at_offset(torch.arange(12).reshape(3, 4).to(dtype), 3)
    view, watch = _guarded(t)
    assert view.shape == t.shape and view.stride() == t.stride()
    assert view.data_ptr() % 64 == t.data_ptr() % 64  # an offset's misalignment is kept
    assert torch.equal(view.view(torch.uint8) if dtype == torch.bool else view,
                       t.view(torch.uint8) if dtype == torch.bool else t)
    view.fill_(1)  # writing the whole buffer touches no guard byte
    watch.check(["out"], "all_reduce (step 0)", "after wait()")
    assert watch.checks() == []


def test_a_write_past_the_end_is_named_with_op_buffer_side_and_bytes() -> None:
    view, watch = _guarded(torch.zeros(5, dtype=torch.float32))
    write_past_end(view)
    watch.check(["out"], "all_gather (step 2)", "after wait()")
    (check,) = watch.checks()
    assert not check.ok and check.tensor == "out" and check.expectation == "guard"
    assert check.note == ("all_gather (step 2) wrote 4 byte(s) past the end of buffer 'out' "
                          "(reaching 4 byte(s) past it, in a 64-byte guard), seen after wait()")
    watch.check(["out"], "all_gather (step 3)", "after wait()")
    assert len(watch.checks()) == 1  # one report per side, the first place it was seen


def test_a_write_before_the_start_includes_an_offsets_gap() -> None:
    view, watch = _guarded(tensors.at_offset(torch.zeros(4, dtype=torch.int16), 2))
    whole = torch.empty(0, dtype=torch.uint8).set_(view.untyped_storage())
    start = view.storage_offset() * 2
    whole[start - 3] = 0  # inside the offset's gap, 3 bytes before the start
    watch.check(["out"], "broadcast (step 0)", "after the call returned")
    (check,) = watch.checks()
    assert "wrote 1 byte(s) before the start of buffer 'out' (reaching 3 byte(s) before it" \
        in check.note


def test_no_guard_and_unguardable_tensors_are_left_alone() -> None:
    t = torch.zeros(3)
    assert guards.wrap("a", t, 0) == (t, None)
    sp = torch.zeros(3).to_sparse()
    assert guards.wrap("a", sp, 64) == (sp, None)


def test_the_guard_is_rounded_to_whole_64_byte_blocks() -> None:
    spec = TensorSpec("a", (4,), "float32", init=None)  # type: ignore[arg-type]
    assert spec.guard_bytes() == 64
    assert [TensorSpec("a", (4,), "float32", None, guard=g).guard_bytes()  # type: ignore[arg-type]
            for g in (0, 1, 64, 65)] == [0, 64, 64, 128]


@pytest.mark.parametrize("value, says", [
    ("-1", "guard"), ("1.5", "guard"), ("100000000", "guard"), ("'x'", "guard")])
def test_a_bad_guard_is_a_collection_error_at_its_position(value: str, says: str) -> None:
    err = case_error(f"""
    cases:
      - name: g
        op: all_reduce
        world_size: 2
        shape: [4]
        guard: {value}
    """)
    assert "cases/x.yaml:7:12" in err and says in err, err


def test_guard_regions_count_toward_the_byte_limits() -> None:
    (inst,) = case_instances("""
    cases:
      - name: g
        op: all_reduce
        world_size: 2
        shape: [4]
        input: "i"
        guard: 1000
    """)
    assert all(t.guard == 1000 and t.guard_bytes() == 1024 for t in inst.tensors)
    from harness.casefile import expand, validate
    from harness.casefile import load as yamlload
    from harness.casefile.limits import Limits
    from harness.errors import CaseFileError

    def expanded(guard: int) -> list[Any]:
        doc = yamlload.load_text(textwrap.dedent(f"""
        cases:
          - name: g
            op: all_reduce
            world_size: 2
            shape: [16]
            input: "i"
            guard: {guard}
        """), "cases/x.yaml")
        # 2 ranks x 64 data bytes: 128 bytes of data, and 2 x 2 x 64 bytes of guard by default
        return [i for c in validate.load_cases(doc)
                for i in expand.expand(c, "gloo", Limits(instance_bytes=128 + 256))]

    assert expanded(0) and expanded(64)
    with pytest.raises(CaseFileError, match="take 640 bytes over all ranks; the limit is 384"):
        expanded(65)  # rounded up to 128 bytes a side


CASES = """
cases:
  - name: single
    op: all_reduce
    world_size: 2
    dtype: [float32, int8]
    shape: [5]
    input: "rank + i"
  - name: listed
    op: all_gather
    world_size: 2
    shape: [3]
    input: "rank + i"
  - name: offset
    op: broadcast
    world_size: 2
    shape: [6]
    offset: 3
    args: {src: 1}
    input: "rank + i"
  - name: strided
    op: all_reduce
    world_size: 2
    shape: [2, 3]
    layout: transposed
    input: "rank + i"
"""


def _run(tmp_path: Path, name: str, cases: str, fault: str | None) -> dict[str, str]:
    project = write_case_file(tmp_path / name, cases)
    args = ["c.yaml", "-q", "--report-json", "r.json", "--report-md", "r.md",
            "--report-html", "r.html"]
    env = None
    if fault is not None:
        args += ["--backend", "mutant", "--backend-module", "harness.mutate.backend"]
        env = {"COLLECTIVE_MUTANT": fault}
    done = run_pytest(project, *args, extra_env=env)
    assert (project / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return {r["key"]: r["message"] if r["outcome"] != "passed" else "passed"
            for r in load_report(project / "r.json")["records"]}


def test_gloo_passes_with_guards_and_the_mutant_writing_past_the_end_fails(
        tmp_path: Path) -> None:
    assert set(_run(tmp_path, "gloo", CASES, None).values()) == {"passed"}
    got = _run(tmp_path, "mutant", CASES, "writes_past_end")
    assert len(got) == 5 and "passed" not in got.values(), got
    single = next(m for k, m in got.items() if "single" in k and "float32" in k)
    assert ("buffer 'tensor' (guard): all_reduce (step 0) wrote 4 byte(s) past the end of "
            "buffer 'tensor'") in single, single
    # Without guards the write lands in memory the harness never reads: the fault survives.
    unguarded = _run(tmp_path, "off", CASES.replace("    op: all_reduce\n    world_size: 2\n"
                                                    "    dtype", "    guard: 0\n    op: "
                                                    "all_reduce\n    world_size: 2\n    dtype"),
                     "writes_past_end")
    assert [m for k, m in unguarded.items() if "single" in k] == ["passed", "passed"]


def test_a_later_run_refills_the_same_allocation_with_fresh_poison_and_guards() -> None:
    first, watch = _guarded(torch.zeros(4))
    region = watch.regions["out"]
    whole = torch.empty(0, dtype=torch.uint8).set_(first.untyped_storage())
    whole[region.end] = 0  # a write past the end in the first run
    first.fill_(7)
    again, reused = guards.wrap("out", torch.full((4,), 3.0), 64, region)
    assert reused is not None and reused.base is region.base
    assert again.data_ptr() == first.data_ptr()
    assert again.tolist() == [3.0] * 4 and bool((region.base[region.end:] == 0xDB).all())
    _, fresh = guards.wrap("out", torch.zeros(5), 64, region)  # another size: new memory
    assert fresh is not None and fresh.base is not region.base


def test_iterations_reuse_buffers_so_a_stale_result_fails_on_its_iteration(
        tmp_path: Path) -> None:
    """``iterations: 3`` refills the first run's allocations in place: a backend that hands
    a reused buffer its first result back (a stale cache) fails on iteration 2."""
    cases = """
    cases:
      - name: iters
        op: all_reduce
        world_size: 2
        shape: [16]
        input: {generator: exact, seed: 3}
        iterations: 3
        isolate: true
    """
    project = write_case_file(tmp_path, cases)
    args = ["c.yaml", "-q", "--report-json", "r.json", "--report-md", "r.md", "--report-html",
            "r.html", "--backend", "faulty", "--backend-module", "fault_backend"]
    run_pytest(project, *args, extra_env={"COLLECTIVE_FAULT": "none"})
    assert [r["outcome"] for r in load_report(project / "r.json")["records"]] == ["passed"]
    run_pytest(project, *args, extra_env={"COLLECTIVE_FAULT": "stale_on_reuse"})
    (rec,) = load_report(project / "r.json")["records"]
    assert rec["outcome"] == "failed" and "iteration 2" in rec["message"], rec["message"]
