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
