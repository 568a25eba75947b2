"""collective-record --granularity program (issue 28 point 2): one program per recorded step,
call order and waits kept; the written file collects and passes on Gloo as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.record.cases import Recording, render
from harness.record.optable import Call
from harness.record.programs import Event, build_programs, period, split

from .helpers import HANG_S, REPO, load_report, run_pytest

PY = sys.executable


def _record(tmp: Path, example: str) -> Path:
    out = tmp / f"{example}.yaml"
    res = subprocess.run([PY, "-m", "harness.record", "--granularity", "program", "-o",
                          str(out), "--", PY, f"examples/{example}.py"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=HANG_S)
    assert res.returncode == 0, res.stderr
    return out


def _cases(path: Path) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in yaml.safe_load(path.read_text())["cases"]}


def _passes_on_gloo(tmp: Path, path: Path) -> None:
    res = run_pytest(REPO, str(path), "-q", "--report-json", str(tmp / "r.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    report = load_report(tmp / "r.json")
    assert report["summary"]["verdict"] == "PASS"


def _rank_ops(case: dict[str, Any], rank: int) -> list[str]:
    """What one rank does, in order: op names and waits (by the op step they wait)."""
    handles = {s["handle"]: s["op"] for s in case["steps"] if "handle" in s}
    out = []
    for s in case["steps"]:
        if rank not in s.get("ranks", [rank]):
            continue
        out.append(s["op"] if "op" in s else f"wait {handles[s['wait']]}")
    return out


def test_the_pipeline_step_keeps_each_stage_order_and_waits(tmp_path: Path) -> None:
    path = _record(tmp_path, "pipeline_p2p")
    text = path.read_text()
    assert "granularity program: one program per recorded step: step (x4)" in text
    step = _cases(path)["program_step"]
    assert "issued 4 time(s)" in step["description"]
    # examples/pipeline_p2p.py: stage 0 sends, waits, receives, waits; stage 1 the mirror
    assert _rank_ops(step, 0) == ["isend", "wait isend", "irecv", "wait irecv"]
    assert _rank_ops(step, 1) == ["irecv", "wait irecv", "isend", "wait isend"]
    # the received buffers must hold what the other stage sent
    assert set(step["expected"]) == {s["tensor"] for s in step["steps"]
                                     if s.get("op") == "irecv"}
    _passes_on_gloo(tmp_path, path)


def test_the_ddp_run_is_setup_then_one_repeated_step(tmp_path: Path) -> None:
    path = _record(tmp_path, "ddp_buckets")
    cases = _cases(path)
    assert set(cases) == {"program_setup", "program_step"}
    setup, step = cases["program_setup"], cases["program_step"]
    # setup: DDP's parameter checks and initial broadcast, the first iteration's single
    # 1 MiB bucket, the bucket rebuild's broadcasts, in that order
    assert _rank_ops(setup, 0) == ["all_gather", "broadcast", "broadcast", "all_reduce",
                                   "broadcast", "broadcast"]
    # then every bucket of the two later iterations is the same all_reduce: the shortest
    # period of the sequence is one call, issued 12 times (6 buckets x 2 iterations)
    assert _rank_ops(step, 0) == ["all_reduce"]
    assert "issued 12 time(s)" in step["description"]
    assert all(s.get("async") and "handle" in s for s in step["steps"])
    assert "issued from C++ were waited there, not seen" in step["description"]
    assert set(step["expected"]) == {s["tensor"] for s in step["steps"]}  # values checked
    _passes_on_gloo(tmp_path, path)


def test_period_finds_the_repeated_block_after_a_prefix() -> None:
    assert period([9, 1, 2, 1, 2, 1, 2, 7]) == (1, 2, 3)
    assert period([1, 2, 3]) == (0, 3, 1)
    assert period([5, 5, 5, 5]) == (0, 1, 4)


def _call(rank: int, seq: int, op: str = "all_reduce", **kw: Any) -> Call:
    return Call(op=op, rank=rank, group=(0, 1), shape=(4,), dtype="float32", device="cpu",
                layout="contiguous", seq=seq, site="/w/t.py:1", api=op, **kw)


def test_steps_that_do_not_match_across_ranks_stay_one_program() -> None:
    # rank 0 repeats 3 times, rank 1 twice: no common step, the whole run is one program
    ev = {0: [Event(_call(0, n)) for n in range(3)],
          1: [Event(_call(1, 0, reduce_op="max")), Event(_call(1, 1)), Event(_call(1, 2))]}
    assert [label for label, _, _ in split(ev)] == ["run"]


def test_a_wait_is_written_where_it_was_recorded() -> None:
    calls = [_call(r, n, async_op=True) for r in (0, 1) for n in range(2)]
    waits = {r: [(2, 0), (2, 1)] for r in (0, 1)}  # both waited after the second call
    text = render(Recording(world_size=2, calls=calls, source="t", waits=waits),
                  build_programs)
    (case,) = yaml.safe_load(text)["cases"]
    assert [next(iter(s)) for s in case["steps"]] == ["op", "op", "wait", "wait"]
    assert [s.get("wait") for s in case["steps"][2:]] == ["h0", "h1"]


@pytest.mark.parametrize("bad", ["--granularity=instance"])
def test_an_unknown_granularity_is_refused(tmp_path: Path, bad: str) -> None:
    res = subprocess.run([PY, "-m", "harness.record", bad, "-o", str(tmp_path / "o.yaml"),
                          "--", PY, "-c", "pass"], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=HANG_S)
    assert res.returncode == 2 and "invalid choice" in res.stderr
