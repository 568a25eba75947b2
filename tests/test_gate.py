"""The CI gate: classification, policies, baseline files, the command and pytest --baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.gate import baseline as bl
from harness.gate import cli
from harness.gate import compare as gate
from harness.gate.baseline import Baseline, BaselineError, Entry
from harness.report.oneline import one_line
from tests.runs import REPO, Run

AXES = {"world_size": 2, "dtype": "float32", "async": False}


def entry(case: str, outcome: str, backend: str = "gloo", ws: int = 2,
          allow: tuple[str, ...] = ()) -> Entry:
    axes = {**AXES, "world_size": ws}
    return Entry(key=f"c.yaml::{case}[{backend}-ws{ws}]", case=f"c.yaml::{case}",
                 backend=backend, axes=axes, outcome=outcome, reason=f"{outcome} reason",
                 allow=allow)


def classify(was: str, now: str) -> str:
    res = gate.compare([entry("a", now)], Baseline([entry("a", was)]))
    (change,) = res.changes
    return change.category


@pytest.mark.parametrize(("was", "now", "category"), [
    ("passed", "passed", "unchanged"),
    ("failed", "failed", "unchanged"),
    ("passed", "failed", "regression"),
    ("passed", "hang", "regression"),
    ("xfail", "crash", "regression"),
    ("passed", "xfail", "regression"),  # an xfail added to hide a new failure
    ("skipped", "failed", "new_failure"),
    ("failed", "passed", "fixed"),
    ("xfail", "xpass", "fixed"),
    ("xfail", "passed", "fixed"),
    ("passed", "skipped", "newly_skipped"),
    ("failed", "hang", "changed"),
    ("failed", "xfail", "changed"),
    ("skipped", "passed", "changed"),
])
def test_classification(was: str, now: str, category: str) -> None:
    assert classify(was, now) == category


def test_new_missing_and_new_failures() -> None:
    base = Baseline([entry("kept", "passed"), entry("gone", "passed")])
    res = gate.compare([entry("kept", "passed"), entry("fresh", "passed"),
                        entry("fresh_bad", "error")], base)
    cats = {c.key.split("::")[1].split("[")[0]: c.category for c in res.changes}
    assert cats == {"kept": "unchanged", "gone": "missing", "fresh": "new",
                    "fresh_bad": "new_failure"}
    # default policy: a new failure and a missing instance both fail the gate
    assert not res.ok and res.failing() == ["new_failure", "missing"] and res.warning() == []


def test_default_policy_missing_fails_and_can_be_made_a_warning() -> None:
    """Issue 22, point 2: an instance of the baseline absent from the report is a failure by
    default, not "PASS with warnings"; the policy key ``missing`` may make it a warning."""
    base = Baseline([entry("a", "passed"), entry("b", "passed")])
    res = gate.compare([entry("a", "passed")], base)
    assert not res.ok and res.verdict().startswith("FAIL: 1 missing")
    assert "Missing (1, policy fail):" in gate.render_text(res)
    lenient = gate.compare([entry("a", "passed")], base,
                           policy=cli.cli_policy(["missing=warn"], strict=False))
    assert lenient.ok and lenient.verdict().startswith("PASS with warnings: 1 missing")
    assert bl.DEFAULT_POLICY["missing"] == "fail"


def test_baseline_policy_and_allow_are_honoured() -> None:
    # the baseline itself allows regressions (e.g. while a backend is being brought up)
    base = Baseline([entry("a", "passed")], policy={**bl.DEFAULT_POLICY, "regression": "warn"})
    assert gate.compare([entry("a", "failed")], base).ok
    # an entry that allows a flaky outcome
    flaky = Baseline([entry("a", "passed", allow=("hang",))])
    assert gate.compare([entry("a", "hang")], flaky).changes[0].category == "unchanged"
    assert gate.compare([entry("a", "failed")], flaky).changes[0].category == "regression"


@pytest.mark.parametrize(("items", "message"), [
    (["regresion=fail"], "unknown gate category 'regresion'"),
    (["missing=fatal"], "policy for 'missing' must be one of fail, warn, ok"),
    (["missing"], "write CATEGORY=LEVEL"),
])
def test_bad_policy_is_a_clear_error(items: list[str], message: str) -> None:
    with pytest.raises(BaselineError, match=message):
        cli.cli_policy(items, strict=False)


def test_backend_matching_modes() -> None:
    base = Baseline([entry("a", "passed", "gloo"), entry("b", "passed", "gloo")])
    report = [entry("a", "failed", "faulty"), entry("b", "passed", "faulty")]
    auto = gate.compare(report, base)  # one backend each side, different: agnostic
    assert auto.agnostic and "ignoring the backend" in auto.notes[0]
    assert [c.category for c in auto.changes] == ["regression", "unchanged"]
    assert auto.changes[0].key == "c.yaml::a[faulty-ws2]"
    exact = gate.compare(report, base, match="exact")
    assert sorted(c.category for c in exact.changes) == ["missing", "missing", "new",
                                                         "new_failure"]
    # same backend on both sides: matched exactly, other backends' entries are not consulted
    both = Baseline([entry("a", "passed", "gloo"), entry("a", "failed", "nccl")])
    res = gate.compare([entry("a", "failed", "nccl")], both)
    assert not res.agnostic
    assert {c.key: c.category for c in res.changes} == {"c.yaml::a[nccl-ws2]": "unchanged",
                                                        "c.yaml::a[gloo-ws2]": "missing"}
    with pytest.raises(BaselineError, match="two instances match as one"):
        gate.compare([entry("a", "passed")], both, match="agnostic")


def test_baseline_file_is_stable_and_keeps_a_persons_edits(tmp_path: Path) -> None:
    records = [record("b", "passed"), record("a", "failed", message="c.yaml:3: a[gloo-ws2]: "
                                                                    "boom\n  rank 1 raised X")]
    report: dict[str, Any] = {"metadata": {"torch": "2.13.0+cpu"}, "records": records}
    path = tmp_path / "base.json"
    bl.write(str(path), bl.from_report(report))
    first = path.read_text()
    doc = json.loads(first)
    assert [e["key"] for e in doc["entries"]] == ["c.yaml::a[gloo-ws2]", "c.yaml::b[gloo-ws2]"]
    assert doc["entries"][0]["reason"] == "boom: rank 1 raised X"
    assert "created" not in doc and "hostname" not in first  # nothing that changes per run
    # records in another order, same content: the same bytes
    records.reverse()
    bl.write(str(path), bl.from_report(report, bl.load(str(path))))
    assert path.read_text() == first
    # a person's allow/note/policy survive a refresh
    doc["entries"][1]["allow"] = ["hang"]
    doc["entries"][1]["note"] = "flaky on old drivers"
    doc["policy"]["missing"] = "fail"
    path.write_text(json.dumps(doc))
    bl.write(str(path), bl.from_report(report, bl.load(str(path))))
    again = bl.load(str(path))
    b = next(e for e in again.entries if e.key.endswith("b[gloo-ws2]"))
    assert b.allow == ("hang",) and b.note == "flaky on old drivers"
    assert again.policy["missing"] == "fail"


def record(case: str, outcome: str, message: str = "", backend: str = "gloo") -> dict[str, Any]:
    return {"key": f"c.yaml::{case}[{backend}-ws2]", "file": "c.yaml", "line": 3, "case": case,
            "id": f"{backend}-ws2", "backend": backend, "axes": dict(AXES), "outcome": outcome,
            "message": message, "reason": ""}


@pytest.mark.parametrize(("content", "message"), [
    (None, "baseline file not found"),
    ("{not json", "not valid JSON (line 1"),
    ('{"entries": []}', "not a collective-harness baseline"),
    ('{"baseline_version": 1, "entries": [{"key": "k"}]}', "entries[0] is malformed"),
    ('{"baseline_version": 1, "entries": [{"key": "k", "case": "c", "backend": "gloo", '
     '"axes": {}, "outcome": "passd"}]}', "unknown outcome 'passd'"),
])
def test_bad_baseline_files(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BaselineError) as err:
        bl.load(str(path))
    assert message in str(err.value)
    assert str(path) in str(err.value) and "collective-gate" in str(err.value)  # how to fix


def test_one_line_reasons() -> None:
    failed = record("a", "failed", "c.yaml:3: a[gloo-ws2]: wrong values on rank(s) 1\n"
                                   "  rank 1, tensor 'out': 1 of 4 wrong\n  more")
    assert one_line(failed) == "wrong values on rank(s) 1: rank 1, tensor 'out': 1 of 4 wrong"
    xfail = record("a", "xfail", "expected failure (known):\nc.yaml:3: a[gloo-ws2]: hang")
    assert one_line(xfail) == "hang"
    skipped = {**record("a", "skipped", "whatever"), "reason": "no CUDA device"}
    assert one_line(skipped) == "no CUDA device"
    assert len(one_line(record("a", "failed", "x" * 1000))) == 300
    # the message may name another line of the case (the expectation that was not met)
    at_expected = record("a", "failed", "c.yaml:9: a[gloo-ws2]: wrong values on rank(s) 1\n"
                                        "  rank 1, buffer 'out': 1 of 4 wrong")
    assert one_line(at_expected) == ("wrong values on rank(s) 1: rank 1, buffer 'out': 1 of 4 "
                                     "wrong")


def raised(case: str, ws: int, exc: str, message: str) -> dict[str, Any]:
    rec = {**record(case, "error", f"c.yaml:3: {case}[gloo-ws2]: rank(s) 0-{ws - 1} raised\n"
                    f"  ranks 0-{ws - 1}: {exc}: {message}"),
           "axes": {**AXES, "world_size": ws}}
    rec["key"] = f"c.yaml::{case}[gloo-ws{ws}]"
    rec["ranks"] = [{"rank": 0, "status": "raised",
                     "exception": {"type": exc, "message": message + "\nmore detail"}}]
    return rec


def test_failures_are_grouped_by_cause_largest_first() -> None:
    """A backend that rejects one op fails every instance of it the same way: the list is its
    causes (numbers and paths made general), each with a count and a few instances."""
    records = [raised(f"r{i}", 2 + i % 3, "RuntimeError",
                      f"No backend type associated with device type cpu (pg {i} at "
                      f"/tmp/x{i}/pg.py:{40 + i}, 0x{i:x}ff)") for i in range(7)]
    records += [raised("k", 2, "KeyError", "'fut-17'"), raised("k2", 3, "KeyError", "'fut-17'")]
    records += [record("w", "failed", "c.yaml:3: w[gloo-ws2]: wrong values on rank(s) 1\n"
                                      "  rank 1, buffer 'out': 1 of 4 wrong; first: [0] "
                                      "expected 3.5 got 4.5")]
    base = Baseline([bl.Entry(e.key, e.case, e.backend, e.axes, "passed")
                     for e in bl.entries_from_report({"records": records})])
    res = gate.compare(bl.entries_from_report({"records": records}), base)
    text = gate.render_text(res).splitlines()
    at = text.index("Regressions (10, policy fail), 3 cause(s), largest first:")
    assert text[at + 1] == ("  7 x RuntimeError: No backend type associated with device type "
                            "cpu (pg N at <path>:N, 0x…)")
    # The first instance of a cause with its own reason, the next ones by id.
    assert text[at + 2] == ("      c.yaml::r0[gloo-ws2] (c.yaml:3): passed -> error: rank(s) "
                            "0-1 raised: ranks 0-1: RuntimeError: No backend type associated "
                            "with device type cpu (pg 0 at /tmp/x0/pg.py:40, 0x0ff)")
    assert text[at + 3:at + 5] == [
        f"      c.yaml::r{i}[gloo-ws{2 + i % 3}] (c.yaml:3): passed -> error" for i in (1, 2)]
    assert text[at + 5] == "      ... and 4 more of this cause"
    assert text[at + 6] == "  2 x KeyError: 'fut-N'"
    assert text[at + 9] == ("  1 x wrong values on rank(s) N: rank N, buffer 'out': N of N "
                            "wrong; first: [N] expected N got N")
    assert len(text) - at == 11  # ten instances in eleven lines
    md = gate.render_markdown(res)
    assert "- **7** x `RuntimeError: No backend type associated with device type cpu" in md
    assert "  - … and 4 more of this cause" in md
    data = gate.to_json(res)
    assert [(g["count"], g["examples"][:1]) for g in data["causes"]["regression"]] == [
        (7, ["c.yaml::r0[gloo-ws2]"]), (2, ["c.yaml::k2[gloo-ws3]"]), (1, ["c.yaml::w[gloo-ws2]"])]
    assert len(data["changes"]) == 10  # every instance, each with its cause


# -- real runs -----------------------------------------------------------------------------------

def gate_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.gate", *args], capture_output=True,
                          text=True, cwd=REPO, check=False)


def test_report_passes_against_its_own_baseline(gloo_run: Run, gloo_baseline: Path) -> None:
    doc = json.loads(gloo_baseline.read_text())
    assert doc["counts"] == {"passed": 9, "skipped": 1, "xfail": 1}
    proc = gate_cli(str(gloo_run.json), str(gloo_baseline))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("collective-gate: PASS (11 instances: 11 unchanged)")


def test_faulty_backend_fails_naming_each_regression(faulty_run: Run, gloo_baseline: Path,
                                                     tmp_path: Path) -> None:
    md = tmp_path / "gate.md"
    proc = gate_cli(str(faulty_run.json), str(gloo_baseline), "--markdown", str(md),
                    "--json", str(tmp_path / "gate.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("collective-gate: FAIL: 5 regression (11 instances: 5 regression, "
                        "6 unchanged)")
    assert "ignoring the backend (report: faulty; baseline: gloo)" in proc.stdout
    # Listed by cause: each cause with its count, then its instances.
    head = next(i for i, ln in enumerate(lines) if ln.startswith("Regressions (5, policy "
                                                                    "fail), "))
    causes = [ln for ln in lines[head + 1:] if ln.startswith("  ") and " x " in ln[:8]]
    assert sum(int(ln.split(" x ")[0]) for ln in causes) == 5, proc.stdout
    assert all(ln.split(" x ", 1)[1].startswith("wrong values on rank(s) N: rank N, buffer")
               for ln in causes), proc.stdout
    expected = ["ar[faulty-ws2-float32-sum-async]", "ar[faulty-ws2-float32-sum-sync]",
                "ar[faulty-ws2-int64-sum-async]", "ar[faulty-ws2-int64-sum-sync]",
                "bc[faulty-ws2-int64-sync-src0]"]
    assert md.read_text().startswith("## ❌ Conformance gate: FAIL: 5 regression")
    data = json.loads((tmp_path / "gate.json").read_text())
    assert data["ok"] is False and data["counts"]["regression"] == 5
    assert sorted(c["key"] for c in data["changes"]) == [f"cases/cases.yaml::{k}"
                                                         for k in expected]
    for c in data["changes"]:
        assert c["reason"].startswith("wrong values on rank(s) 1: rank 1, buffer")
        assert c["cause"].startswith("wrong values on rank(s) N: rank N, buffer")


def test_gate_input_errors_exit_2(gloo_run: Run, tmp_path: Path) -> None:
    proc = gate_cli(str(tmp_path / "none.json"), str(tmp_path / "b.json"))
    assert proc.returncode == 2 and "report not found" in proc.stderr
    proc = gate_cli(str(gloo_run.json), str(tmp_path / "b.json"))
    assert proc.returncode == 2 and "baseline file not found" in proc.stderr
    # the hint names the files given, never the project's own baseline
    assert f"collective-gate {gloo_run.json} {tmp_path / 'b.json'} --update" in proc.stderr
    assert "ci/baselines" not in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    proc = gate_cli(str(bad), str(tmp_path / "b.json"))
    assert proc.returncode == 2 and "not a collective-harness report" in proc.stderr


def test_pytest_baseline_fails_the_session_on_regressions(faulty_run: Run) -> None:
    assert faulty_run.returncode == 1, faulty_run.output
    out = faulty_run.output
    section = out[out.index("collective-harness gate"):]
    assert "collective-gate: FAIL: 5 regression" in section
    assert "cases/cases.yaml::bc[faulty-ws2-int64-sync-src0]" in section


def test_pytest_baseline_allows_known_failures(faulty_run: Run, tmp_path: Path) -> None:
    """Failures recorded in the baseline do not fail the session; pytest still shows them."""
    from tests.runs import make_project, run_pytest

    known = tmp_path / "faulty.json"
    assert cli.main([str(faulty_run.json), str(known), "--update"]) == 0
    again = run_pytest(make_project(tmp_path / "again"), "faulty", "--baseline", str(known))
    assert again.returncode == 0, again.output
    assert "5 failed" in again.output
    assert "collective-gate: PASS (11 instances: 11 unchanged)" in again.output


def test_pytest_baseline_bad_path_is_a_usage_error(tmp_path: Path) -> None:
    from tests.runs import make_project, run_pytest

    run = run_pytest(make_project(tmp_path), "gloo", "--baseline", "nope.json")
    assert run.returncode == 4
    assert "--baseline: " in run.output and "baseline file not found" in run.output
    assert "collective-harness: reports written" not in run.output  # nothing ran
    # how to create *this* baseline from the paths given, not the bundled suite's
    # (the session's own arguments, less --baseline: pasted, it collects what this run did)
    assert ("create it with: pytest cases --rootdir=. -p no:cacheprovider -q --backend gloo "
            "--deadline 30 && collective-gate reports/conformance.json nope.json "
            "--update") in run.output, run.output
    assert "ci/baselines" not in run.output


def test_console_script_is_declared() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'collective-gate = "harness.gate.cli:main"' in text
    proc = gate_cli("--help")
    assert proc.returncode == 0 and "--update" in proc.stdout and "--match" in proc.stdout


def test_committed_baseline_matches_the_case_library() -> None:
    """ci/baselines/gloo-cpu.json must list exactly the instances `pytest cases/` collects."""
    base = bl.load(str(REPO / "ci" / "baselines" / "gloo-cpu.json"))
    assert base.backends == ["gloo"] and base.policy == bl.DEFAULT_POLICY
    proc = subprocess.run([sys.executable, "-m", "pytest", "cases/", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "--backend", "gloo"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    collected = {ln for ln in proc.stdout.splitlines() if "::" in ln}
    keys = {e.key for e in base.entries}
    assert collected, proc.stdout + proc.stderr
    assert collected == keys, (
        f"ci/baselines/gloo-cpu.json is stale: {len(collected - keys)} collected instance(s) "
        f"not in it, {len(keys - collected)} entry(ies) no longer collected. Refresh it with: "
        f"{bl.REFRESH_HINT}")


def test_a_baselines_refresh_comment_names_its_own_files(gloo_run: Run,
                                                        gloo_baseline: Path) -> None:
    """Issue 26, point 2: never the bundled suite's paths in a user's baseline."""
    comment = json.loads(gloo_baseline.read_text())["comment"]
    assert (f"Refresh: the run that writes {gloo_run.json}, then collective-gate "
            f"{gloo_run.json} {gloo_baseline} --update") in comment
    assert "ci/baselines" not in comment and "cases/" not in comment
