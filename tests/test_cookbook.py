"""docs/cookbook/cookbook.yaml: the first-hour patterns (DDP, FSDP, pipeline, broadcast,
subgroups, MoE, read-before-wait, must-raise, a known crash) run as written, on Gloo."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .helpers import REPO, load_report, run_pytest

COOKBOOK = REPO / "docs" / "cookbook" / "cookbook.yaml"
PATTERNS = {"ddp_bucket_bf16_avg", "fsdp_round_trip", "pipeline_ring", "weight_broadcast",
            "tp_dp_subgroups", "moe_token_exchange", "read_before_wait", "must_raise_bad_root",
            "known_crash_size_mismatch"}


def test_the_cookbook_runs_as_written(tmp_path: Path) -> None:
    res = run_pytest(REPO, str(COOKBOOK), "-q", "--report-json", str(tmp_path / "r.json"),
                     "--report-md", str(tmp_path / "r.md"), "--report-html",
                     str(tmp_path / "r.html"))
    assert res.returncode == 0, res.stdout + res.stderr
    report = load_report(tmp_path / "r.json")
    assert report["summary"]["verdict"] == "PASS"
    by_case: dict[str, Counter[str]] = {}
    for r in report["records"]:
        by_case.setdefault(r["case"], Counter())[r["outcome"]] += 1
    assert set(by_case) == PATTERNS
    assert by_case.pop("known_crash_size_mismatch") == Counter(limitation=1)
    assert all(set(c) == {"passed"} for c in by_case.values()), by_case
