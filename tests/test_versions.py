"""Across torch versions: the version-diff page (collective-versions) and the gate's honesty when
report and baseline come from different versions."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.gate import baseline as bl
from harness.gate import cli, versions
from harness.gate import compare as gate
from harness.report.records import validate_report
from tests.runs import REPO, Run


def rec(case: str, outcome: str, expected: str = "pass", *, op: str = "all_reduce",
        dtype: str = "float32", message: str = "", backend: str = "gloo") -> dict[str, Any]:
    axes = {"world_size": 2, "dtype": dtype}
    key = f"c.yaml::{case}[{backend}-ws2-{dtype}]"
    return {"key": key, "file": "c.yaml", "line": 7, "case": case, "id": f"{backend}-ws2-{dtype}",
            "backend": backend, "axes": axes, "outcome": outcome, "expected": expected,
            "op": op, "dtype": dtype, "reason": "", "message": message or f"c.yaml:7: {case}"}


def report(torch: str, records: list[dict[str, Any]], nccl: str = "") -> dict[str, Any]:
    return {"metadata": {"torch": torch, "nccl_version": nccl, "backends": ["gloo"],
                         "options": {"full": False}}, "records": records}


def test_versions_compare_on_the_release_and_nccl() -> None:
    V = versions.Versions
    assert V("2.13.0+cpu").same_as(V("2.13.0"))  # one release, two builds
    assert not V("2.4.1").same_as(V("2.13.0+cpu"))
    assert not V("2.13.0", "2.21.5").same_as(V("2.13.0", "2.26.2"))
    assert V("2.13.0", "2.21.5").same_as(V("2.13.0"))  # only one side recorded NCCL


def test_a_passing_rejection_is_not_a_passing_result() -> None:
    """Both pass, but one met 'raises' (a documented rejection): that is a change."""
    old = report("2.4.1", [rec("avg", "passed", "raises"), rec("sum", "passed")])
    new = report("2.13.0", [rec("avg", "passed"), rec("sum", "passed")])
    res = versions.diff(old, new)
    assert res.matched == 2 and [d.key for d in res.differences] == [
        "c.yaml::avg[gloo-ws2-float32]"]
    assert res.differences[0].change == ("rejected (raises, documented)", "works")


def test_diff_groups_per_op_and_change_and_lists_evidence() -> None:
    a = [{**rec("rs", "xfail", op="reduce_scatter_tensor", dtype=d,
                message=f"expected failure (returns the SUM)\nc.yaml:7: rs[gloo-ws2-{d}]: wrong"),
          "reason": "returns the SUM"} for d in ("int32", "float32")]
    a += [rec("g1", "skipped", op="gather_single"), rec("only_old", "passed")]
    b = [rec("rs", "passed", op="reduce_scatter_tensor", dtype=d) for d in ("int32", "float32")]
    b += [rec("g1", "passed", "raises", op="gather_single"), rec("only_new", "passed")]
    res = versions.diff(report("2.4.1+cu121", a), report("2.15.0+cu128", b), "old.json",
                        "new.json")
    groups = res.by_op()
    assert list(groups) == ["gather_single", "reduce_scatter_tensor"]
    rs = groups["reduce_scatter_tensor"]
    assert list(rs) == [("wrong result or unexpected error (xfail, documented)", "works")]
    assert len(res.only_a) == 1 and len(res.only_b) == 1
    page = versions.render_markdown([res], command="collective-versions old.json new.json")
    assert page.startswith("# What changed between torch versions\n")
    head = page.index("## torch 2.4.1+cu121 → torch 2.15.0+cu128")
    assert page.index("| A | `old.json` | torch 2.4.1+cu121") > head  # both sides named first
    assert "| `reduce_scatter_tensor` | 2 | float32, int32 |" in page
    # evidence: the instance, where it is, and what each side's report said
    assert ("`c.yaml::rs[gloo-ws2-int32]` (c.yaml:7): A: wrong [documented: returns the SUM] / "
            "B: passed") in page
    assert "**skipped → rejected (raises, documented)** (1 instance; dtypes: float32)" in page
    assert "Only in A (1 instances" in page and "`all_reduce` 1" in page
    text = versions.render_text(res)
    assert text.splitlines()[0] == ("collective-versions: A old.json (torch 2.4.1+cu121) vs B "
                                    "new.json (torch 2.15.0+cu128)")


def test_same_versions_say_so_and_no_difference_says_so() -> None:
    same = versions.diff(report("2.13.0+cpu", [rec("a", "passed")]),
                         report("2.13.0", [rec("a", "passed")]))
    page = versions.render_markdown([same])
    assert "Both reports come from the same versions" in page
    assert "No instance behaves differently." in page


def test_command_reads_gzip_and_chains_reports(gloo_run: Run, tmp_path: Path) -> None:
    paths = []
    for n, (torch, outcome) in enumerate([("2.4.1", "failed"), ("2.13.0", "passed"),
                                          ("2.15.0", "passed")]):
        doc = json.loads(gloo_run.json.read_text())
        doc["metadata"]["torch"] = torch
        first = next(r for r in doc["records"] if r["outcome"] == "passed")
        first["outcome"] = outcome
        path = tmp_path / f"r{n}.json.gz"
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            json.dump(doc, fh)
        paths.append(str(path))
    md = tmp_path / "page.md"
    proc = subprocess.run([sys.executable, "-m", "harness.gate.versions", *paths, "--markdown",
                           str(md)], capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"collective-versions: A {paths[0]} (torch 2.4.1) vs B")
    assert f": fails -> works: 1 ({first['dtype']})" in proc.stdout
    page = md.read_text()
    assert "## torch 2.4.1 → torch 2.13.0" in page and "## torch 2.13.0 → torch 2.15.0" in page
    assert f"Generated by `collective-versions {' '.join(paths)} --markdown {md}`" in page
    assert f"`{first['key']}`" in page
    later = page[page.index("## torch 2.13.0 → torch 2.15.0"):]
    assert "No instance behaves differently." in later


def test_command_input_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert versions.main([str(tmp_path / "none.json"), str(tmp_path / "b.json")]) == 2
    assert "report not found" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    assert versions.main([str(bad), str(bad)]) == 2
    assert "not a collective-harness report" in capsys.readouterr().err


def test_real_report_compares_with_itself_as_same_version(gloo_run: Run) -> None:
    doc = json.loads(gloo_run.json.read_text())
    validate_report(doc)
    res = versions.diff(doc, doc)
    assert res.matched == len(doc["records"]) and not res.differences


# -- the gate across versions --------------------------------------------------------------------

def entry(case: str, outcome: str) -> bl.Entry:
    return bl.Entry(key=f"c.yaml::{case}[gloo-ws2]", case=f"c.yaml::{case}", backend="gloo",
                    axes={"world_size": 2}, outcome=outcome)


@pytest.mark.parametrize(("was", "now"), [("passed", "failed"), ("skipped", "failed"),
                                          ("failed", "passed"), ("passed", "skipped"),
                                          ("passed", "xfail")])
def test_across_versions_differences_are_changed_not_regressions(was: str, now: str) -> None:
    base = bl.Baseline([entry("a", was), entry("same", "passed")])
    res = gate.compare([entry("a", now), entry("same", "passed"), entry("fresh", "failed")],
                       base, across_versions="report torch 2.4.1 vs baseline torch 2.13.0")
    cats = {c.key.split("::")[1].split("[")[0]: c.category for c in res.changes}
    # an instance the baseline never had is still a new failure: no version explains it
    assert cats == {"a": "changed", "same": "unchanged", "fresh": "new_failure"}
    text = gate.render_text(res)
    assert text.splitlines()[0] == ("collective-gate: report torch 2.4.1 vs baseline torch "
                                    "2.13.0 (different versions)")
    assert "classified as changed, not as a regression" in text
    assert gate.render_markdown(res).startswith(
        "## ❌ Conformance gate across versions (report torch 2.4.1 vs baseline torch 2.13.0)")


def gate_files(tmp_path: Path, report_torch: str, base_torch: str,
               same_version: bool = False) -> gate.GateResult:
    rep = tmp_path / "r.json"
    rep.write_text("{}")
    base = bl.Baseline([entry("a", "passed")], torch=base_torch)
    bpath = tmp_path / "b.json"
    bl.write(str(bpath), base)
    doc = report(report_torch, [{"key": "c.yaml::a[gloo-ws2]", "file": "c.yaml", "line": 1,
                                 "case": "a", "backend": "gloo", "axes": {"world_size": 2},
                                 "outcome": "failed", "message": "boom", "reason": ""}])
    loaded = bl.load(str(bpath))
    assert loaded.torch == base_torch  # the baseline records the version it came from
    res = gate.compare(bl.entries_from_report(doc), loaded, across_versions="" if same_version
                       else versions.across(doc, loaded))
    return res


def test_gate_classifies_by_the_recorded_versions(tmp_path: Path) -> None:
    assert gate_files(tmp_path, "2.4.1", "2.13.0+cpu").changes[0].category == "changed"
    assert gate_files(tmp_path, "2.13.0", "2.13.0+cpu").changes[0].category == "regression"
    # a baseline without a version: nothing says they differ, regressions stay regressions
    assert gate_files(tmp_path, "2.4.1", "").changes[0].category == "regression"
    assert gate_files(tmp_path, "2.4.1", "2.13.0", True).changes[0].category == "regression"


def test_gate_command_across_versions(gloo_run: Run, gloo_baseline: Path, tmp_path: Path) -> None:
    doc = json.loads(gloo_baseline.read_text())
    assert doc["torch"]  # written by --update from the report's metadata
    doc["torch"] = "2.0.0"  # a release no run of this suite reports (it needs torch>=2.4)
    doc["entries"][0]["outcome"] = "failed"  # failed then, passes now: a change, not a fix
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "harness.gate", str(gloo_run.json), str(old)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = proc.stdout.splitlines()[:2]
    assert first.startswith("collective-gate: report torch 2.")
    assert first.endswith("vs baseline torch 2.0.0 (different versions)")
    assert second.startswith("collective-gate: PASS (11 instances: 1 changed, 10 unchanged)")
    assert cli.main([str(gloo_run.json), str(old), "--same-version"]) == 0  # fixed only warns


def test_a_changed_rejection_is_a_change_and_raw_bytes_do_not_split_it() -> None:
    def rejected(message: str) -> dict[str, Any]:
        r = rec("self", "passed", "raises", op="recv")
        r["ranks"] = [{"rank": 0, "status": "raised",
                       "exception": {"type": "RuntimeError", "message": message}}]
        return r

    old = report("2.4.1", [rejected("[pair.cc:589] writev [none]: Bad file descriptor")])
    new = report("2.13.0", [rejected("[pair.cc:312] Pair is not connected")])
    (d,) = versions.diff(old, new).differences
    assert d.change == ("rejected (raises, documented): RuntimeError: writev [none]",
                        "rejected (raises, documented): RuntimeError: Pair is not connected")
    # torch writes some enum values into messages as raw bytes: MIN and MAX read the same
    a = report("2.13.0", [rejected("reduce does not support\x03on complex tensors")])
    b = report("2.15.0", [rejected("reduce does not support\x04on complex tensors")])
    assert not versions.diff(a, b).differences
