"""The job-summary helper: verdict first, the matrix folded, always within the byte budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.report import step_summary as ss
from tests.runs import REPO

VERDICT = "## ❌ Conformance gate: FAIL: 2 regression\n\n- `a` passed → failed\n"


def matrix(rows: int) -> str:
    lines = ["# Conformance: gloo", "", "| op | float32 |", "|---|---|"]
    lines += [f"| op_{i} | ✅ {i} ❌ 1 |" for i in range(rows)]
    lines += ["", "```", "a code block that must stay closed", *(["x" * 80] * rows), "```"]
    return "\n".join(lines) + "\n"


def test_small_summary_is_whole_and_ordered() -> None:
    text = ss.compose(VERDICT, matrix(3))
    assert text.startswith(VERDICT.rstrip())
    assert "<details><summary>Conformance matrix</summary>" in text
    assert text.index("Conformance gate") < text.index("<details>") < text.index("| op_2 |")
    assert text.rstrip().endswith("</details>") and "Truncated" not in text


@pytest.mark.parametrize("budget", [600, 2_000, 10_000, 50_000])
def test_large_summary_is_cut_within_budget(budget: int) -> None:
    text = ss.compose(VERDICT, matrix(2_000), budget=budget)
    size = len(text.encode("utf-8"))
    assert size <= budget
    assert text.startswith("## ❌ Conformance gate: FAIL")  # verdict kept, and first
    assert text.rstrip().endswith("</details>")
    assert "Truncated to fit the 1 MiB job-summary limit" in text
    assert text.count("```") % 2 == 0  # an open code fence is closed
    for line in text.splitlines():  # cut on line boundaries: no half table row
        assert not line.startswith("| op_") or line.endswith("|")


def test_default_budget_fits_githubs_limit() -> None:
    huge = ss.compose(VERDICT * 2_000, matrix(30_000))
    assert len(huge.encode("utf-8")) <= ss.GITHUB_LIMIT
    assert ss.DEFAULT_BUDGET < ss.GITHUB_LIMIT


def test_multibyte_characters_are_never_split() -> None:
    one_line = "❌" * 5_000  # a single 15 000-byte line
    text = ss.truncate(one_line, 1_000)
    assert len(text.encode("utf-8")) <= 1_000
    text.encode("utf-8").decode("utf-8")  # valid UTF-8
    assert text.startswith("❌❌")


def test_cli_appends_to_the_summary_file_and_counts_what_is_there(tmp_path: Path) -> None:
    gate_md, report_md, out = tmp_path / "gate.md", tmp_path / "conf.md", tmp_path / "summary"
    gate_md.write_text(VERDICT)
    report_md.write_text(matrix(200))
    out.write_text("earlier step\n" * 100)
    before = out.stat().st_size
    proc = subprocess.run([sys.executable, str(REPO / "ci" / "step_summary.py"), "--gate",
                           str(gate_md), "--matrix", str(report_md), "--budget", "5000"],
                          env={"GITHUB_STEP_SUMMARY": str(out), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("earlier step\n") and text[before:].startswith("## ❌")
    assert out.stat().st_size <= 5000


def test_cli_without_a_gate_result_says_so(tmp_path: Path) -> None:
    out = tmp_path / "summary"
    assert ss.main(["--gate", str(tmp_path / "missing.md"), "--matrix",
                    str(tmp_path / "missing2.md"), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("## ❓ No gate verdict") and "missing.md` was not written" in text
