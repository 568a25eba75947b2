"""collective-mutate: the fault catalogue, the kill/survive verdicts, and one real run.

The end-to-end test runs the real command on a three-instance slice of the bundled library
with three faults (about a minute alone): two the slice must kill and one it cannot see
(bfloat16 values, while the slice moves float32 and int64 only), so survivors are shown to be
reported, not only kills. Another runs the two through-a-failure faults against the two
instances of cases/fault_tolerance.yaml that kill them (about 25 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.mutate import cli, faults
from harness.mutate.backend import flip, saturating_sum
from harness.mutate.runner import Options, Outcome, Session, judge_fault

from .helpers import HANG_S

ROOT = Path(__file__).resolve().parents[1]


def test_catalogue_has_at_least_twenty_distinct_described_faults() -> None:
    assert len(faults.NAMES) >= 20 and len(set(faults.NAMES)) == len(faults.NAMES)
    assert faults.FAITHFUL not in faults.NAMES
    for name in faults.NAMES:
        assert len(faults.describe(name)) > 20


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8, torch.bool,
                                   torch.complex64, torch.float64])
def test_flip_changes_exactly_one_element_of_any_dtype(dtype: torch.dtype) -> None:
    t = torch.ones(3, 4, dtype=dtype).t()  # non-contiguous too
    before = t.clone()
    flip(t, last=True)
    changed = (t.view(-1) if t.is_contiguous() else t.reshape(-1)) != before.reshape(-1)
    assert int(changed.sum()) == 1 and bool(changed[-1])


def test_saturating_sum_clamps_where_torch_wraps() -> None:
    a = torch.tensor([127, -128, 100, 1], dtype=torch.int8)
    b = torch.tensor([1, -1, 100, 1], dtype=torch.int8)
    assert saturating_sum([a, b]).tolist() == [127, -128, 127, 2]
    assert (a + b).tolist() == [-128, 127, -56, 2]  # what the contract (torch) says
    big = torch.iinfo(torch.int64).max
    x = torch.tensor([big, -big, 5], dtype=torch.int64)
    y = torch.tensor([1, -5, 5], dtype=torch.int64)
    assert saturating_sum([x, y]).tolist() == [big, -big - 1, 10]


def _session(outcomes: dict[str, str], rc: int = 0) -> Session:
    return Session("f", {n: {"outcome": o, "message": f"{n}: {o}"} for n, o in outcomes.items()},
                   rc, 1.0, "tail")


def test_a_fault_is_killed_only_by_an_instance_that_passed_faithfully() -> None:
    passed = {"a", "b"}
    killed = judge_fault("bxor_as_bor", passed, _session({"a": "passed", "b": "failed"}, 1))
    assert killed.status == "killed" and [k["nodeid"] for k in killed.killed_by] == ["b"]
    # "c" failed under the fault but did not pass faithfully: no kill; all of a, b passed.
    survived = judge_fault("bxor_as_bor", passed,
                           _session({"a": "passed", "b": "passed", "c": "failed"}, 1))
    assert survived.status == "survived" and survived.instances_run == 2
    assert survived.does == faults.describe("bxor_as_bor")


def test_an_unfinished_session_is_neither_killed_nor_survived() -> None:
    passed = {"a", "b"}
    missing = judge_fault("bxor_as_bor", passed, _session({"a": "passed"}, 2))
    assert missing.status == "inconclusive" and "1 faithful-passing instance(s) did not run" \
        in missing.detail
    odd = judge_fault("bxor_as_bor", passed, _session({"a": "passed", "b": "skipped"}))
    assert odd.status == "inconclusive" and "skipped" in odd.detail


def test_render_lists_score_and_blind_spots() -> None:
    ok = judge_fault("p2p_tags_ignored", {"a"}, _session({"a": "failed"}, 1))
    gone = judge_fault("bf16_wrong_value", {"a"}, _session({"a": "passed"}))
    doc = cli.to_json(Outcome({"passed": 1, "instances": 1}, [ok, gone], 3.0),
                      Options(paths=["cases"]))
    text = cli.render(doc)
    assert "killed        p2p_tags_ignored" in text and "by a (failed)" in text
    assert "mutation score: 1/2 faults killed (50.0%)" in text
    assert f"  - bf16_wrong_value: {faults.describe('bf16_wrong_value')}" in text


def test_unknown_fault_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cases", "--faults", "nope"]) == 2
    assert "unknown fault(s) nope; --list-faults shows them" in capsys.readouterr().err


def test_real_run_reports_kills_and_a_survivor(tmp_path: Path) -> None:
    out = tmp_path / "mutate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.mutate", "cases/p2p.yaml", "-k",
         "tags or irecv_not_completed_before_data", "-j", "3", "--faults",
         "p2p_tags_ignored,early_complete_p2p,bf16_wrong_value", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=HANG_S)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a survivor: exit 1
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["faithful"]["passed"] == doc["faithful"]["instances"] == 3
    status = {f["name"]: f for f in doc["faults"]}
    assert status["p2p_tags_ignored"]["status"] == "killed"
    assert status["p2p_tags_ignored"]["killed_by"][0]["nodeid"].startswith(
        "cases/p2p.yaml::tags[mutant-ws2")
    assert status["early_complete_p2p"]["status"] == "killed"
    assert "is_completed() was True when the call returned" in (
        status["early_complete_p2p"]["killed_by"][0]["message"])
    assert status["bf16_wrong_value"]["status"] == "survived"
    assert status["bf16_wrong_value"]["instances_run"] == 3
    assert doc["score"] == {"killed": 2, "total": 3, "ratio": 0.6667}
    assert doc["survivors"] == [{"name": "bf16_wrong_value",
                                 "does": faults.describe("bf16_wrong_value")}]
    assert "mutation score: 2/3 faults killed (66.7%)" in proc.stdout
    assert "blind spots (survivors):\n  - bf16_wrong_value:" in proc.stdout


def test_the_bundled_failure_cases_kill_the_through_a_failure_faults(tmp_path: Path) -> None:
    """docs/howto/mutation-score.md: two instances of cases/fault_tolerance.yaml kill both."""
    out = tmp_path / "mutate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.mutate", "cases/fault_tolerance.yaml", "-k",
         "dies_before_all_reduce and ws3 or dies_before_all_gather", "-j", "2", "--faults",
         "survivor_wait_hangs,stale_rank_after_reform", "--deadline", "30", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # every fault killed
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["faithful"]["passed"] == doc["faithful"]["instances"] == 2
    status = {f["name"]: f for f in doc["faults"]}
    hangs = status["survivor_wait_hangs"]
    assert hangs["status"] == "killed", hangs
    # The survivors' bounded step ends the wait, not the deadline: the bound is named.
    assert hangs["killed_by"][0]["nodeid"].startswith(
        "cases/fault_tolerance.yaml::dies_before_all_reduce[mutant-ws3")
    assert hangs["killed_by"][0]["outcome"] == "hang"
    assert "past its bound of 10 s" in hangs["killed_by"][0]["message"]
    stale = status["stale_rank_after_reform"]
    assert stale["status"] == "killed", stale
    assert stale["killed_by"][0]["nodeid"].startswith(
        "cases/fault_tolerance.yaml::dies_before_all_gather[mutant-ws3")
    assert stale["killed_by"][0]["outcome"] == "failed"
    assert "buffer 'out2'" in stale["killed_by"][0]["message"]
    assert doc["score"] == {"killed": 2, "total": 2, "ratio": 1.0}


def test_docs_document_every_fault() -> None:
    text = (ROOT / "docs" / "howto" / "mutation-score.md").read_text()
    for f in faults.FAULTS:
        assert f"| `{f.name}` | {f.does} |" in text, f.name
