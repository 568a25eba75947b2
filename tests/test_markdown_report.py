"""The Markdown report: what GitHub shows of it (no wrapping apart, failures with values)."""

from __future__ import annotations

from typing import Any

from harness.report import markdown
from harness.report.records import build_report
from tests.test_html_report import rec


def failing_report() -> dict[str, Any]:
    bad = rec("ar", "all_reduce", "float32", 2, False, "failed",
              "cases/x.yaml:7: ar[gloo-ws2-float32-sync]: wrong values on rank(s) 1")
    bad["ranks"][1]["checks"] = [{"tensor": "output", "ok": False, "expectation": "auto",
                                  "wrong": 2, "total": 4, "digest": "",
                                  "first_wrong": [{"index": 3, "expected": "4.0",
                                                   "got": "6.0"}]}]
    cuda = {**rec("ar", "all_reduce", "float32", 2, True, "skipped"), "device": "cuda",
            "reason": "no CUDA device"}
    return build_report([bad, rec("ar", "all_reduce", "int64", 2, False, "passed"), cuda],
                        {"torch": "2.13.0+cpu", "hostname": "h", "options": {}})


def test_symbols_and_counts_do_not_wrap_apart() -> None:
    text = markdown.render(failing_report())
    row = next(ln for ln in text.splitlines() if ln.startswith("| all_reduce"))
    # a no-break space binds each symbol to its count; groups are separated by plain spaces
    assert row == "| all_reduce | ❌\u00a01 ⏭️\u00a01 | ✅\u00a01 |"
    assert "✅\u00a0passed" in text and "✅ passed" not in text


def test_failure_list_shows_first_wrong_element() -> None:
    text = markdown.render(failing_report())
    line = next(ln for ln in text.splitlines() if ln.startswith("- **failed**"))
    assert line.endswith("<br>first wrong: `rank 1 'output'[3]: expected 4.0 got 6.0 "
                         "(2 of 4 wrong)`")


def test_heading_names_devices_that_ran() -> None:
    text = markdown.render(failing_report())
    assert text.splitlines()[0].startswith(
        "# Conformance: gloo on cpu (cuda: 1 skipped, none ran)")


def test_a_multi_op_program_is_counted_in_every_row_it_issues() -> None:
    fsdp = rec("fsdp", "all_gather_into_tensor", "float32", 2, False, "passed")
    fsdp["issued"] = [{"op": "all_gather_into_tensor", "family": "all_gather"},
                      {"op": "reduce_scatter_tensor", "family": "reduce_scatter"}]
    text = markdown.render(build_report([fsdp], {"torch": "2.13.0+cpu", "hostname": "h",
                                                 "options": {}}))
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "✅" in ln]
    assert rows == ["| all_gather_into_tensor | ✅\u00a01 |",
                    "| reduce_scatter_tensor | ✅\u00a01 |"]
    assert "1 program instance(s) issue several ops and are counted in the row of each" in text


def test_only_overrides_not_applied_that_bear_on_a_failure_are_listed() -> None:
    """Issue 43.4: the report opened with ~80 lines of the library's overrides for other torch
    versions and backends. Now a count, and listed only the ones covering an instance with an
    unexpected outcome (judged without its override, the divergence may be that failure)."""
    bad = rec("ar", "all_reduce", "float32", 2, False, "failed")
    bad["overrides_not_applied"] = [{"line": 10, "scope": "torch", "when": "torch <2.5",
                                     "reason": "documents the failure"}]
    good = rec("ok", "all_reduce", "int64", 2, False, "passed")
    good["overrides_not_applied"] = [{"line": 20, "scope": "backend", "when": "backend nccl",
                                      "reason": "about another backend"},
                                     {"line": 30, "scope": "torch", "when": "torch <2.5",
                                      "reason": "about another torch"}]
    text = markdown.render(build_report([bad, good], {"torch": "2.13.0+cpu", "hostname": "h",
                                                      "options": {}}))
    assert ("> **Overrides not applied** because of their scope: 2 because of the torch version"
            " (2 instance(s)); 1 because of the backend (1 instance(s)).") in text
    assert ("The other 2 cover no instance with an unexpected outcome here: listed in the JSON "
            "report (`summary.overrides_not_applied`) and the HTML report.") in text
    assert "`cases/x.yaml:10` (torch <2.5; 1 instance(s)): documents the failure" in text
    assert "about another backend" not in text and "about another torch" not in text
    clean = markdown.render(build_report([good], {"torch": "2.13.0+cpu", "hostname": "h",
                                                  "options": {}}))
    notice = [ln for ln in clean.splitlines() if "Overrides not applied" in ln]
    assert len(notice) == 1 and "The 2 cover no instance" in notice[0]
    assert "<details>" not in clean
