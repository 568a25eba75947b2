"""Verdict integrity: the report never says more than was observed.

Each test here fails on a harness that drops records, calls an interrupted session PASS, lets
the gate be more positive than pytest, counts declared limitations as passes or leaves
half-written report sets behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.gate import cli as gate
from harness.report import html, markdown, records

from .helpers import (
    HANG_S,
    finish,
    load_report,
    pytest_argv,
    run_pytest,
    signal_state,
    start,
    wait_for,
    write_case_file,
)

PASSING = """
cases:
  - name: first
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
  - name: second
    op: broadcast
    world_size: 2
    args: {src: 0}
    shape: [2]
    input: {0: [5, 6], others: poison}
    expected: {others: [5, 6]}
"""

# Sorted by pool key, the failing instance runs before the two at world size 2.
STOPS = """
cases:
  - name: wrong
    op: all_reduce
    world_size: 1
    shape: [2]
    input: "i"
    expected: [7, 7]
  - name: fine_a
    op: all_reduce
    world_size: 2
    shape: [2]
    input: "i"
  - name: fine_b
    op: all_reduce
    world_size: 2
    shape: [3]
    input: "i"
"""

SLOW = """
cases:
  - name: quick
    op: all_reduce
    world_size: 1
    shape: [2]
    input: "i"
  - name: slow
    world_size: 2
    deadline: 120
    tensors: {t: {shape: [1], init: 1}}  # no step writes it: it must come back untouched
    steps:
      - {sleep: 60}
  - name: never_reached
    op: all_reduce
    world_size: 2
    shape: [2]
    input: "i"
"""

# Written next to the cases: marks when the slow instance has started (polled by the test).
MARKER_CONFTEST = """
from pathlib import Path

def pytest_runtest_call(item):
    if "slow" in item.nodeid:
        Path("slow-started").write_text(item.nodeid)
"""


def project(tmp_path: Path, cases: str, conftest: str = "") -> Path:
    return write_case_file(tmp_path, cases, conftest=conftest)


def run(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_pytest(where, "c.yaml", "--rootdir", str(where), *args)


def report(where: Path) -> dict[str, Any]:
    return load_report(where / "reports" / "conformance.json")


def gate_against_itself(where: Path, *extra: str) -> tuple[int, str]:
    """Gate the report against a baseline made from it: only session problems can fail."""
    rep = where / "reports" / "conformance.json"
    base = where / "base.json"
    assert gate.main([str(rep), str(base), "--update"]) == 0
    out = where / "gate.json"
    code = gate.main([str(rep), str(base), "--json", str(out), *extra])
    return code, out.read_text()


# -- 2. vanishing records ---------------------------------------------------------------------

INJECT_JUDGE = """
import harness.runner.execute

def _broken_judge(*args, **kwargs):
    raise RuntimeError("injected judge failure")

harness.runner.execute.judge = _broken_judge
"""

INJECT_SETUP = """
import harness.casefile.overrides

def _broken_resolve(*args, **kwargs):
    raise ValueError("injected setup failure")

harness.casefile.overrides.resolve = _broken_resolve
"""


@pytest.mark.parametrize(("conftest", "stage", "text"), [
    (INJECT_JUDGE, "running or judging", "injected judge failure"),
    (INJECT_SETUP, "setting up", "injected setup failure"),
])
def test_internal_failure_is_an_error_record_not_a_missing_one(
        tmp_path: Path, conftest: str, stage: str, text: str) -> None:
    where = project(tmp_path, PASSING, conftest)
    res = run(where, "-q")
    assert res.returncode == 1, res.stdout + res.stderr
    rep = report(where)
    assert len(rep["records"]) == 2  # exactly one record per collected instance
    for rec in rep["records"]:
        assert rec["outcome"] == "error"
        assert "bug in the harness, not a verdict on the backend" in rec["message"]
        assert rec["harness_error"]["stage"] == stage
        assert text in rec["harness_error"]["traceback"]
    assert rep["session"]["complete"] is True
    assert rep["summary"]["verdict"] == "FAIL"


def test_a_dropped_record_fails_the_gate(tmp_path: Path, passed_once: Path) -> None:
    """Simulate the old failure mode: pytest failed, yet no failing record (a lost record)."""
    where = tmp_path
    _previous_pass(where, passed_once)
    rep_path = where / "reports" / "conformance.json"
    code, text = gate_against_itself(where, "--pytest-status", "1")
    assert code == 1
    assert "no record failed" in text
    # The same report with pytest's real status passes.
    assert gate.main([str(rep_path), str(where / "base.json"), "--pytest-status", "0"]) == 0


def test_collection_error_beside_passing_cases_is_not_pass(tmp_path: Path) -> None:
    where = project(tmp_path, PASSING)
    (where / "broken.yaml").write_text("cases:\n  - name: x\n    op: al_reduce\n")
    res = run_pytest(where, "c.yaml", "broken.yaml", "--continue-on-collection-errors", "-q")
    assert res.returncode == 1, res.stdout + res.stderr
    rep = report(where)
    assert rep["summary"]["passed"] == 2
    assert rep["session"]["unexplained_failures"] == 1
    assert rep["summary"]["verdict"] == "FAIL"
    code, text = gate_against_itself(where)
    assert code == 1 and "are not in the report" in text


# -- 3. incomplete sessions ---------------------------------------------------------------------

@pytest.mark.parametrize("option", [["-x"], ["--maxfail", "1"]])
def test_stopped_early_is_incomplete(tmp_path: Path, option: list[str]) -> None:
    where = project(tmp_path, STOPS)
    res = run(where, "-q", *option)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "INCOMPLETE: 2 of 3 collected instance(s) have no result" in res.stdout
    rep = report(where)
    session = rep["session"]
    assert session["complete"] is False
    assert session["collected"] == 3 and session["without_result"] == 2
    assert "stopping after 1 failures" in session["ended_by"]
    assert rep["summary"]["verdict"] == "INCOMPLETE" and rep["summary"]["ok"] is False
    md = (where / "reports" / "conformance.md").read_text()
    assert md.startswith("> **⛔ INCOMPLETE SESSION**: 1 of 3 collected instances")
    html = (where / "reports" / "conformance.html").read_text()
    assert 'id="incomplete"' in html and "INCOMPLETE SESSION" in html
    code, text = gate_against_itself(where)
    assert code == 1 and "incomplete" in json.loads(text)["failing"]
    # The policy key lets a deliberately partial run through.
    code, _ = gate_against_itself(where, "--policy", "incomplete=warn")
    assert code == 0


def test_selection_is_not_incompleteness(tmp_path: Path) -> None:
    where = project(tmp_path, PASSING)
    res = run(where, "-q", "-k", "first")
    assert res.returncode == 0, res.stdout + res.stderr
    rep = report(where)
    assert rep["session"]["complete"] is True
    assert rep["session"]["selection"]["keyword"] == "first"
    assert rep["session"]["selection"]["deselected"] == 1
    assert rep["summary"]["verdict"] == "PASS"
    assert rep["summary"]["headline"].startswith("PASS: 1 instances: 1 conformant")
    # ... but the headline says that it is a selection (issue 26, point 6).
    assert rep["summary"]["headline"].endswith("only a selection ran (-k first): not the "
                                               "whole suite")


XDIST_STOP = """
cases:
  - name: wrong
    op: all_reduce
    world_size: 1
    shape: [2]
    input: "i"
    expected: [7, 7]
  - name: many
    op: all_reduce
    world_size: 1
    dtype: [float32, float64, int32, int64, int8, uint8, bfloat16, float16]
    reduce_op: [sum, max, min]
    shape: [2]
    input: "i"
  - name: long_matrix
    op: all_reduce
    world_size: 1
    marks: [full]
    shape: [2]
    input: "i"
"""


def test_a_stop_under_xdist_is_named_as_such_and_full_is_pointed_at(tmp_path: Path) -> None:
    where = project(tmp_path, XDIST_STOP)
    res = run(where, "-q", "-n", "2", "-x")
    assert res.returncode == 2, res.stdout + res.stderr  # xdist's stop is an Interrupted
    rep = report(where)
    assert rep["session"]["ended_by"].startswith("stopped early: stopping after 1 failures"), (
        rep["session"])
    serial = run(where, "-q")
    assert ("collective-harness: 1 deselected: 1 instance(s) of the long matrix (marked "
            "'full'; add --full to run them)") in serial.stdout


@pytest.mark.parametrize(("sig", "ended"), [(signal.SIGINT, "interrupted (Ctrl-C"),
                                            (signal.SIGTERM, "terminated (SIGTERM)")])
def test_signal_mid_run_writes_an_incomplete_report(tmp_path: Path, sig: signal.Signals,
                                                     ended: str) -> None:
    where = project(tmp_path, SLOW, MARKER_CONFTEST)
    proc = start(where, pytest_argv("c.yaml", "-q", "--rootdir", str(where)), merge_stderr=True)
    try:
        wait_for(lambda: (where / "slow-started").exists() or proc.poll() is not None, HANG_S,
                 "the slow instance to start")
        assert proc.poll() is None, proc.communicate()[0]
        state = signal_state(proc.pid)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, f"{state}\n{out}"
    rep = report(where)
    session = rep["session"]
    assert session["complete"] is False and ended in session["ended_by"]
    assert session["collected"] == 3 and session["without_result"] == 2
    assert rep["summary"]["verdict"] == "INCOMPLETE"
    assert [r["case"] for r in rep["records"]] == ["quick"]
    md = (where / "reports" / "conformance.md").read_text()
    assert md.splitlines()[0].startswith("> **⛔ INCOMPLETE SESSION**")
    assert "Verdict: PASS" not in md


# -- 5b. no stale verdict: a run that does not finish never leaves an older report standing --

@pytest.fixture(scope="module")
def passed_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose PASSING cases passed, its reports, junit.xml and the baseline made
    from them, at the default paths: run once, copied by each test that needs an earlier
    run (each ran it for itself)."""
    where = tmp_path_factory.mktemp("passed")
    write_case_file(where, PASSING)
    res = run(where, "-q", "--junitxml", "junit.xml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert report(where)["summary"]["verdict"] == "PASS"
    # The baseline CI keeps from that run, to gate later reports against.
    assert gate.main([str(where / "reports" / "conformance.json"), str(where / "base.json"),
                      "--update"]) == 0
    return where


def _previous_pass(where: Path, passed: Path) -> dict[str, Any]:
    """The earlier run's project copied into ``where``: a PASS report at the default paths,
    as an earlier run leaves it."""
    shutil.copytree(passed, where, dirs_exist_ok=True)
    before = report(where)
    assert before["summary"]["verdict"] == "PASS"
    return before


def test_a_killed_run_never_leaves_the_previous_pass(tmp_path: Path, passed_once: Path) -> None:
    where = tmp_path
    _previous_pass(where, passed_once)
    assert 'errors="0" failures="0"' in (where / "junit.xml").read_text()
    project(where, SLOW, MARKER_CONFTEST)
    proc = start(where, pytest_argv("c.yaml", "-q", "--rootdir", str(where), "--junitxml",
                                    "junit.xml"), merge_stderr=True)
    try:
        wait_for(lambda: (where / "slow-started").exists() or proc.poll() is not None, HANG_S,
                 "the slow instance to start")
        assert proc.poll() is None, proc.communicate()[0]
        # SIGKILL: no hook runs, nothing is written at the end.
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        finish(proc, 60)
    rep = report(where)
    assert rep["summary"]["verdict"] == "INCOMPLETE", rep["summary"]
    assert rep["session"]["complete"] is False
    assert "not finished" in rep["session"]["ended_by"]
    assert rep["records"] == []
    md = (where / "reports" / "conformance.md").read_text()
    assert "INCOMPLETE" in md.splitlines()[0] and "Verdict: PASS" not in md
    assert "Verdict: PASS" not in (where / "reports" / "conformance.html").read_text()
    # pytest writes --junitxml only at the end: the earlier all-green file is gone too.
    junit = (where / "junit.xml").read_text()
    assert 'errors="1"' in junit and 'message="INCOMPLETE: started at ' in junit, junit
    # ... and the gate, against the baseline of the earlier PASS, refuses it.
    assert gate.main([str(where / "reports" / "conformance.json"),
                      str(where / "base.json")]) == 1


def test_a_collection_error_never_leaves_the_previous_pass(tmp_path: Path,
                                                          passed_once: Path) -> None:
    where = tmp_path
    _previous_pass(where, passed_once)
    (where / "broken.yaml").write_text("cases:\n  - name: x\n    op: al_reduce\n")
    res = run_pytest(where, "broken.yaml", "-q", "--rootdir", str(where))
    assert res.returncode == 2, res.stdout + res.stderr  # pytest: interrupted at collection
    rep = report(where)
    assert rep["summary"]["verdict"] == "INCOMPLETE"
    assert rep["session"]["ended_by"].startswith("stopped by pytest"), rep["session"]


@pytest.mark.parametrize(("option", "says"), [
    (["--baseline", "nope.json"], "--baseline: "),
    (["--perf", "--perf-min-time", "nan"], "--perf-min-time nan: must be a finite number"),
])
def test_a_usage_error_in_a_harness_option_never_leaves_the_previous_pass(
        tmp_path: Path, option: list[str], says: str, passed_once: Path) -> None:
    """A script that ignores pytest's exit status and gates the report must not gate an
    earlier PASS when the harness refused this run's options."""
    where = tmp_path
    _previous_pass(where, passed_once)
    res = run(where, "-q", *option)
    assert res.returncode == pytest.ExitCode.USAGE_ERROR, res.stdout + res.stderr
    rep = report(where)
    assert rep["summary"]["verdict"] == "INCOMPLETE" and rep["records"] == []
    assert rep["session"]["ended_by"].startswith(f"did not start: usage error: {says}")
    assert "\n" not in rep["session"]["ended_by"]
    assert "Verdict: PASS" not in (where / "reports" / "conformance.md").read_text()


def test_a_session_without_case_files_leaves_the_report_alone(tmp_path: Path,
                                                             passed_once: Path) -> None:
    where = tmp_path
    before = _previous_pass(where, passed_once)
    (where / "test_plain.py").write_text("def test_ok():\n    assert True\n")
    res = run_pytest(where, "test_plain.py", "-q", "--rootdir", str(where))
    assert res.returncode == 0, res.stdout + res.stderr
    assert report(where) == before


# -- 6. limitations -----------------------------------------------------------------------------

LIMITED = """
cases:
  - name: avg_int
    op: all_reduce
    dtype: int64
    reduce_op: avg
    shape: [2]
    input: "i"
    overrides:
      - {when: {backend: gloo}, raises: "can't be cast|AVG", reason: Gloo has no integer AVG}
  - name: plain
    op: all_reduce
    shape: [2]
    input: "i"
"""


def test_limitation_everywhere(tmp_path: Path) -> None:
    where = project(tmp_path, LIMITED)
    res = run(where, "-v", "-rL", "--junitxml", "junit.xml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "LIMITATION" in res.stdout and "1 passed, 1 limitation" in res.stdout
    assert "LIMITATION c.yaml::avg_int[gloo-ws2-int64-avg-sync] - Gloo has no integer AVG" \
        in res.stdout
    rep = report(where)
    assert rep["summary"]["limitation"] == 1 and rep["summary"]["passed"] == 1
    assert "1 conformant" in rep["summary"]["headline"]
    assert "1 limitation" in rep["summary"]["headline"]
    junit = (where / "junit.xml").read_text()
    assert 'name="outcome" value="limitation"' in junit
    assert 'name="reason" value="Gloo has no integer AVG"' in junit
    md = (where / "reports" / "conformance.md").read_text()
    assert "🚫\xa01" in md and "Gloo has no integer AVG" in md


def test_gate_classifies_limitation_changes() -> None:
    from harness.gate.baseline import Baseline, Entry
    from harness.gate.compare import compare

    def entry(outcome: str, case: str) -> Entry:
        return Entry(f"c.yaml::{case}[x]", f"c.yaml::{case}", "gloo", {"a": 1}, outcome)

    pairs = {"a": ("passed", "limitation"), "b": ("limitation", "passed"),
             "c": ("limitation", "failed"), "d": ("limitation", "limitation"),
             "e": ("xfail", "limitation")}
    base = Baseline([entry(was, case) for case, (was, _) in pairs.items()])
    res = compare([entry(now, case) for case, (_, now) in pairs.items()], base)
    got = {c.key.split("::")[1][0]: c.category for c in res.changes}
    assert got == {"a": "regression", "b": "fixed", "c": "regression", "d": "unchanged",
                   "e": "changed"}


# -- 12. reports always complete and consistent -------------------------------------------------

SURROGATE = r'''
cases:
  - name: odd_text
    description: "a lone surrogate \udc80 in a description"
    world_size: 2
    steps:
      - {raise: "boom \udcff here"}
'''


def test_lone_surrogate_does_not_break_reports(tmp_path: Path) -> None:
    # A case file cannot carry one (a clean collection error, issue 11): no crash, no report
    # claiming PASS, no temporary files.
    where = project(tmp_path, SURROGATE)
    res = run(where, "-q", "--junitxml", "junit.xml")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "INTERNALERROR" not in res.stdout + res.stderr
    assert "c.yaml:4:" in res.stdout and "U+DC80" in res.stdout
    assert not list((where / "reports").glob(".tmp-*")) if (where / "reports").exists() else True
    # A backend's exception message can still hold one: every writer copes with it.
    rec = {"key": "c.yaml::odd[gloo-ws2]", "nodeid": "c.yaml::odd[gloo-ws2]", "file": "c.yaml",
           "line": 3, "case": "odd", "id": "gloo-ws2", "description": "lone \udc80 here",
           "backend": "gloo", "device": "cpu", "world_size": 2, "dtype": "float32",
           "op": "all_reduce", "family": "all_reduce", "reduce_op": None, "async": False,
           "axes": {}, "outcome": "error", "expected": "pass", "reason": "why \udcff",
           "message": "boom \udcff here", "duration_s": 0.0, "pool_replaced": True,
           "ranks": []}
    meta = {"torch": "2.13.0", "hostname": "h", "options": {}}
    report_obj = records.build_report([rec], meta)
    out = tmp_path / "out"
    out.mkdir()
    records.write_all([(str(out / "r.json"), json.dumps(report_obj)),
                       (str(out / "r.md"), markdown.render(report_obj)),
                       (str(out / "r.html"), html.render(report_obj))])
    assert "\\udcff" in (out / "r.md").read_text(encoding="utf-8")
    assert "Verdict: PASS" not in (out / "r.md").read_text(encoding="utf-8")
    assert not list(out.glob(".tmp-*"))


def test_report_set_is_all_or_nothing(tmp_path: Path) -> None:
    first = tmp_path / "a.json"
    first.write_text("old")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a folder should be")
    with pytest.raises(OSError):
        records.write_all([(str(first), "new"), (str(blocker / "b.md"), "new")])
    assert first.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "not-a-dir"]
    records.write_all([(str(first), "new"), (str(tmp_path / "b.md"), "new \udc80")])
    assert first.read_text() == "new" and (tmp_path / "b.md").read_text() == "new \\udc80"
    assert not list(tmp_path.glob(".tmp-*"))


# -- 8, 9, 10: derived async axis, supported observations, messages ------------------------------

SHAPES = """
cases:
  - name: prog_async
    world_size: 2
    tensors: {t: {shape: [2], init: "i"}}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {wait: h}
    expected: {t: "i * 2"}
  - name: prog_mixed
    world_size: 2
    tensors: {t: {shape: [2], init: "i"}}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {wait: h}
      - {op: all_reduce, tensor: t}
    expected: {t: "i * 4"}
  - name: empty
    op: all_reduce
    world_size: 2
    async: true
    shape: [0]
    input: "i"
    ordering: all
  - name: filled
    op: all_reduce
    world_size: 2
    async: true
    shape: [4]
    input: "i"
    ordering: all
  - name: unchecked
    world_size: 2
    tensors: {t: {shape: [2], init: "i"}}
    steps:
      - {op: all_reduce, tensor: t}
    expected: {}
    raises: "never raised"
"""


def test_derived_async_axis_supported_labels_and_honest_messages(
        judged: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    res, where = judged
    assert res.returncode == 1, res.stdout + res.stderr  # "unchecked" fails: nothing raised
    by = {r["case"]: r for r in report(where)["records"]}
    assert by["unchecked"]["outcome"] == "failed"
    # 8: a program's async axis comes from its steps.
    assert by["prog_async"]["id"].endswith("-async") and by["prog_async"]["axes"]["async"] == \
        "async"
    assert by["prog_mixed"]["id"].endswith("-mixed") and by["prog_mixed"]["axes"]["async"] == \
        "mixed"
    html = (where / "reports" / "conformance.html").read_text()
    assert "<td>mixed</td>" in html and "<td>async</td>" in html
    # 9: with nothing to move, no label about when data moved.
    empty, filled = by["empty"]["ordering"], by["filled"]["ordering"]
    for check in ("pre_op", "post_wait", "host_blocking"):
        assert empty[check]["status"] == "n/a" and "nothing to move" in empty[check]["detail"]
        assert filled[check]["status"] == "ok"
    assert "observed" not in empty["host_blocking"]
    assert filled["host_blocking"]["observed"] == "blocks"
    # 10: a case that checks no values never claims correct values.
    msg = by["unchecked"]["message"]
    assert "correct values" not in msg
    assert "outputs were not checked" in msg or "the checked buffers held" in msg


# -- 11. overrides not applied because of their scope ------------------------------------------

SCOPED = """
cases:
  - name: known_elsewhere
    op: all_reduce
    world_size: 1
    shape: [2]
    input: "i"
    expected: [9, 9]
    overrides:
      - when: {backend: gloo, torch: "<2.0"}
        xfail: true
        reason: wrong on an old torch only
"""


def test_report_header_lists_overrides_not_applied(
        judged: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    res, where = judged
    assert res.returncode == 1, res.stdout + res.stderr
    rep = report(where)
    assert {r["case"]: r for r in rep["records"]}["known_elsewhere"]["outcome"] == "failed"
    [entry] = rep["summary"]["overrides_not_applied"]
    assert entry["scope"] == "torch" and entry["when"] == "torch <2.0"
    assert entry["instances"] == 1 and entry["cases"] == ["known_elsewhere"]
    md = (where / "reports" / "conformance.md").read_text()
    notice = ("> **Overrides not applied** because of their scope: 1 because of "
              "the torch version (1 instance(s))")
    # In the header, right after the verdict (which stays the first thing to read).
    assert md.index("**Verdict: FAIL**") < md.index(notice) < md.index("| op |")
    assert "wrong on an old torch only" in md
    assert "Overrides not applied" in (where / "reports" / "conformance.html").read_text()


def test_step_summary_shows_an_incomplete_session_above_the_fold() -> None:
    from harness.report import step_summary

    matrix = ("> **⛔ INCOMPLETE SESSION**: 1 of 3 collected instances have a result\n\n"
              "# Conformance: gloo\n\n**Verdict: INCOMPLETE** — ...\n")
    text = step_summary.compose("## ❌ Conformance gate: FAIL: incomplete", matrix)
    assert text.index("INCOMPLETE SESSION") < text.index("<details>")


def test_baseline_in_pytest_fails_an_incomplete_session(tmp_path: Path) -> None:
    """With --baseline, a known failure no longer fails the session; stopping after it with -x
    must still fail it, since the other instances never ran."""
    where = project(tmp_path, STOPS)
    assert run(where, "-q").returncode == 1
    assert gate.main([str(where / "reports" / "conformance.json"), str(where / "base.json"),
                      "--update"]) == 0
    full = run(where, "-q", "--baseline", "base.json")
    assert full.returncode == 0, full.stdout  # the one failure is known to the baseline
    stopped = run(where, "-q", "-x", "--baseline", "base.json")
    assert stopped.returncode == 1, stopped.stdout
    assert "the session was incomplete: 2 of 3 collected instance(s) have no result" \
        in stopped.stdout


RAISE_NOT_RAISED = """
cases:
  - name: wrong_and_not_raised
    world_size: 2
    tensors: {t: {shape: [2], dtype: int64, init: "rank"}}
    steps:
      - {op: all_reduce, tensor: t}
    expected: {t: 5}
    raises: "never raised"
  - name: right_and_not_raised
    world_size: 2
    tensors: {t: {shape: [2], dtype: int64, init: "rank"}}
    steps:
      - {op: all_reduce, tensor: t}
    expected: {t: 1}
    raises: "never raised"
"""


def test_expected_raise_not_raised_names_wrong_values(
        judged: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """When a rejection was expected and every rank finished, the message says which checked
    values were wrong instead of claiming that they held what was expected (a torch where a
    rejected call started to work showed this: the group it made was not the expected one)."""
    res, where = judged
    assert res.returncode == 1, res.stdout + res.stderr
    by = {r["case"]: r for r in report(where)["records"]}
    wrong = by["wrong_and_not_raised"]["message"]
    assert "no rank raised; values:" in wrong and "expected 5 got 1" in wrong, wrong
    assert "held what was expected" not in wrong
    right = by["right_and_not_raised"]["message"]
    assert "no rank raised; the checked buffers held what was expected: 't'" in right, right


# -- 5c. outputs that cannot be written (issue 22, point 5) -------------------------------------

@pytest.mark.parametrize(("option", "says"), [
    (["--report-json", "afile/r.json"], "afile is a file, not a folder"),
    (["--report-json", "adir"], "adir: is a directory; give a file path for the report"),
    (["--report-md", "afile/sub/r.md"], "afile is a file, not a folder"),
    (["--junitxml", "afile/junit.xml"], "afile is a file, not a folder"),
])
def test_an_unusable_report_path_is_refused_before_the_run(tmp_path: Path, option: list[str],
                                                            says: str) -> None:
    where = project(tmp_path, PASSING)
    (where / "afile").write_text("x")
    (where / "adir").mkdir()
    res = run(where, "-q", *option)
    assert res.returncode == pytest.ExitCode.USAGE_ERROR, res.stdout + res.stderr
    assert f"{option[0]} {option[1]}: " in res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr
    assert not list(where.rglob(".tmp-*"))


BREAK_REPORTS = """
import pathlib
import shutil

def pytest_runtest_call(item):
    reports = pathlib.Path("reports")
    if reports.is_dir():
        shutil.rmtree(reports)
        reports.write_text("the folder became a file during the run")
"""


def test_a_path_that_breaks_during_the_run_loses_no_record(tmp_path: Path) -> None:
    where = project(tmp_path, PASSING, BREAK_REPORTS)
    res = run(where, "-q")
    assert res.returncode == 1, res.stdout + res.stderr  # passed, but not where expected
    line = next(ln for ln in res.stdout.splitlines() if "could not write the report" in ln)
    folder = Path(line.rsplit(" was written to ", 1)[1].removesuffix(" instead"))
    rep = load_report(folder / "conformance.json")
    assert rep["summary"]["verdict"] == "PASS" and len(rep["records"]) == 2
    assert (folder / "conformance.md").exists() and (folder / "conformance.html").exists()
    assert not list(where.rglob(".tmp-*"))
    shutil.rmtree(folder)


GROUP_RAISES = """
cases:
  - name: bxor_of_floats_in_a_subgroup
    op: all_reduce
    world_size: 3
    dtype: float32
    reduce_op: bxor
    args: {group: [0, 2]}
    shape: [2]
    input: "i"
    raises: "Cannot use ReduceOp.BXOR with non-integral dtype"
  - name: a_member_that_finishes
    op: all_reduce
    world_size: 3
    dtype: float32
    args: {group: [0, 2]}
    shape: [2]
    input: "i"
    raises: "never"
"""


def test_raises_in_a_subgroup_is_asked_of_its_members(
        judged: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Issue 43.8: 'every rank must raise' in a case whose op runs on a subgroup asked rank 1,
    which never calls the op, to raise too, and rank 1 ran the reference model (which
    rejects a bitwise reduction of floats) although its buffers need only come back
    untouched: the case failed although the backend did what it says, and collective-fuzz
    reported known Gloo behaviour on subgroups as findings."""
    recs = {r["case"]: r for r in report(judged[1])["records"]}
    ok = recs["bxor_of_floats_in_a_subgroup"]
    assert ok["outcome"] == "passed", ok["message"]
    assert "every member of the group [0, 2] raised as expected" in ok["message"]
    bad = recs["a_member_that_finishes"]
    assert bad["outcome"] == "failed", bad["message"]
    assert bad["message"].splitlines()[0].endswith(
        "expected every member of the group [0, 2] to raise an error matching 'never'")
    assert "rank 1 finished\n" in bad["message"] + "\n"
    assert "rank 0 finished  <- expected to raise" in bad["message"]


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """SHAPES, SCOPED, RAISE_NOT_RAISED and GROUP_RAISES in one file, run in one child
    session: four tests read their own cases' records from it (and the overrides' notice,
    which only SCOPED's case can cause), where each ran a pytest, a probe and a forkserver
    of its own. The result and the project folder."""
    text = "cases:\n" + "".join(t.split("cases:\n", 1)[1]
                                for t in (SHAPES, SCOPED, RAISE_NOT_RAISED, GROUP_RAISES))
    where = project(tmp_path_factory.mktemp("judged"), text)
    return run(where, "-q"), where
