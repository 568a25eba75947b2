"""Issue 38: a run in which nothing ran is never PASS.

A session's verdict needs at least one executed instance (its ranks ran and were judged). A
misspelt ``--backend``, or one that no ``--backend-module`` registered, is a usage error
before any rank starts; a session whose every instance was skipped, or that selected none, is
NOTHING RAN in every report and exits 5; the gate refuses such a report whatever the baseline
says; external mode gives the same verdict. Runs are made the way a user makes them: a child
pytest, ``collective-gate`` and ``python -m harness.external``.
"""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from harness.gate import cli as gate
from harness.report import headline

from .helpers import (
    HANG_S,
    PYTHON,
    finish,
    load_report,
    run_pytest,
    start,
    subprocess_env,
    write_case_file,
)

# The instances the case itself skips on Gloo (decided in the parent, no rank started).
SKIPPED = """
cases:
  - name: not_here
    op: all_reduce
    world_size: 2
    dtype: [float32, int64]
    shape: [2]
    input: "1"
    overrides:
      - when: {backend: gloo}
        skip: true
        reason: skipped on purpose by the case
"""
# The same, and one instance that runs.
MIXED = SKIPPED + """
  - name: ar
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
"""

USAGE_ERROR = 4
NOTHING_RAN_EXIT = 5


def report(where: Path) -> dict[str, Any]:
    return load_report(where / "reports" / "conformance.json")


def summary(where: Path) -> dict[str, Any]:
    return dict(report(where)["summary"])


# -- the verdict itself --------------------------------------------------------------------------

def test_the_verdict_needs_an_executed_instance() -> None:
    complete = {"complete": True, "unexplained_failures": 0}
    assert headline.verdict({"skipped": 3, "total": 3}, complete) == "NOTHING RAN"
    assert headline.verdict({"total": 0}, complete) == "NOTHING RAN"
    assert headline.verdict({}, None) == "NOTHING RAN"  # no session block: the records alone
    # One instance that ran is enough, whatever its outcome; the worse verdicts still win.
    assert headline.verdict({"skipped": 3, "limitation": 1, "total": 4}, complete) == "PASS"
    assert headline.verdict({"skipped": 3, "xfail": 1, "total": 4}, complete) == "PASS"
    assert headline.verdict({"skipped": 3, "failed": 1, "total": 4}, complete) == "FAIL"
    assert headline.verdict({"total": 0}, {"complete": False}) == "INCOMPLETE"
    assert headline.verdict({"total": 0}, {**complete, "unexplained_failures": 1}) == "FAIL"
    line = headline.headline({"skipped": 3, "total": 3}, complete)
    assert line.startswith("NOTHING RAN: 3 instances: ") and "all 3 were skipped" in line
    none = headline.headline({"total": 0}, {**complete, "selection": {"deselected": 7}})
    assert "none was collected (7 deselected)" in none and "nothing unexpected" not in none


# -- the backend named on the command line -------------------------------------------------------

def test_a_misspelt_or_unregistered_backend_is_a_usage_error_before_any_rank(
        tmp_path: Path) -> None:
    """``--backend glo`` and ``--backend mutant`` without its --backend-module: exit 4, one
    line naming --backend-module (and the nearest name when there is one), no record."""
    write_case_file(tmp_path, MIXED)
    res = run_pytest(tmp_path, "c.yaml", "--backend", "glo")
    assert res.returncode == USAGE_ERROR, res.stdout[-2000:] + res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("ERROR:")]
    assert line.startswith("ERROR: --backend 'glo' is not a backend torch has built in")
    assert "did you mean 'gloo'?" in line and "--backend-module MODULE" in line
    assert "Traceback" not in res.stdout + res.stderr
    started = report(tmp_path)
    assert started["records"] == [] and started["summary"]["verdict"] == "INCOMPLETE"
    assert "did not start: usage error: --backend 'glo'" in started["session"]["ended_by"]

    res = run_pytest(tmp_path, "c.yaml", "--backend", "mutant", "--no-report")
    assert res.returncode == USAGE_ERROR, res.stdout[-2000:] + res.stderr[-2000:]
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("ERROR:")]
    assert "'mutant'" in line and "--backend-module MODULE" in line and "gloo" in line
    assert "collected" not in res.stdout  # stopped before collection: no rank could start


def test_a_backend_registered_by_a_module_or_a_torch_plugin_is_accepted(tmp_path: Path) -> None:
    """The same name is fine once --backend-module registers it, or once a package's
    ``torch.backends`` entry point does when torch is imported (no --backend-module)."""
    write_case_file(tmp_path, MIXED)
    by_module = run_pytest(tmp_path, "c.yaml", "--backend", "mutant", "--backend-module",
                           "harness.mutate.backend", "-q", "--no-report")
    assert by_module.returncode == 0, by_module.stdout[-2000:] + by_module.stderr[-2000:]
    assert "3 passed" in by_module.stdout  # the case's skip names gloo only
    site = tmp_path / "site"
    info = site / "plugged-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugged\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nplugged = plugged:register\n")
    (site / "plugged.py").write_text("def register():\n"
                                     "    import harness.mutate.backend  # registers mutant\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    by_plugin = subprocess.run([PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "c.yaml",
                                "--backend", "mutant", "-q", "--no-report"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=HANG_S, env=env)
    assert by_plugin.returncode == 0, by_plugin.stdout[-2000:] + by_plugin.stderr[-2000:]
    assert "3 passed" in by_plugin.stdout


# -- sessions in which nothing ran ---------------------------------------------------------------

def test_a_session_whose_every_instance_is_skipped_is_nothing_ran(tmp_path: Path) -> None:
    """Every report says NOTHING RAN, the JUnit file has a session error, and the exit status
    is 5 (pytest alone says 0)."""
    write_case_file(tmp_path, SKIPPED)
    res = run_pytest(tmp_path, "c.yaml", "-q", "--junitxml", "junit.xml")
    assert res.returncode == NOTHING_RAN_EXIT, res.stdout[-2000:] + res.stderr[-2000:]
    assert "2 skipped" in res.stdout
    got = summary(tmp_path)
    assert got["verdict"] == "NOTHING RAN" and got["ok"] is False
    head = str(got["headline"])
    assert head.startswith("NOTHING RAN: 2 instances: 0 conformant")
    assert "no instance was executed: all 2 were skipped" in head
    assert f"collective-harness: {head}" in res.stdout
    md = (tmp_path / "reports" / "conformance.md").read_text()
    assert "**Verdict: NOTHING RAN**" in md and "**Verdict: PASS**" not in md
    html = (tmp_path / "reports" / "conformance.html").read_text()
    assert "NOTHING RAN: 2 instances" in html and 'verdict run pass' not in html
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("tests") == "3"
    (error,) = [tc.find("error") for tc in suite.iter("testcase")
                if tc.get("name") == "session"]
    assert error is not None and error.get("message") == head


def test_a_session_that_deselects_everything_is_nothing_ran(tmp_path: Path) -> None:
    write_case_file(tmp_path, MIXED)
    res = run_pytest(tmp_path, "c.yaml", "-k", "no_such_case", "--no-report", "-q")
    assert res.returncode == NOTHING_RAN_EXIT
    # --no-report: the terminal still says it, on a line of its own.
    assert "collective-harness: NOTHING RAN: 0 instances" in res.stdout
    res = run_pytest(tmp_path, "c.yaml", "-k", "no_such_case", "-q")
    assert res.returncode == NOTHING_RAN_EXIT
    got = report(tmp_path)
    assert got["records"] == [] and got["summary"]["verdict"] == "NOTHING RAN"
    assert "none was collected (3 deselected)" in got["summary"]["headline"]


def test_a_normal_run_and_a_project_of_plain_tests_are_unaffected(tmp_path: Path) -> None:
    """One instance ran and passed beside two skipped: PASS, exit 0. A session with no case
    file at all (a project's own tests, with the plugin installed) exits 0 as before."""
    write_case_file(tmp_path, MIXED)
    res = run_pytest(tmp_path, "c.yaml", "-q")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = summary(tmp_path)
    assert got["verdict"] == "PASS" and got["ok"] is True
    assert str(got["headline"]).endswith("2 skipped; nothing unexpected")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "test_x.py").write_text("def test_x():\n    assert True\n")
    res = run_pytest(plain, "test_x.py", "-q")
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout + res.stderr
    assert not (plain / "reports").exists()


# -- the gate ------------------------------------------------------------------------------------

def test_the_gate_refuses_a_report_in_which_nothing_ran(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Against a baseline written from the very same report (every instance unchanged),
    collective-gate fails; so does pytest --baseline, which still exits 5."""
    write_case_file(tmp_path, SKIPPED)
    assert run_pytest(tmp_path, "c.yaml", "-q").returncode == NOTHING_RAN_EXIT
    rep, base = tmp_path / "reports" / "conformance.json", tmp_path / "base.json"
    assert gate.main([str(rep), str(base), "--update"]) == 0
    capsys.readouterr()
    assert gate.main([str(rep), str(base), "--json", str(tmp_path / "g.json")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("collective-gate: FAIL: nothing_ran"), out
    assert "FAIL: nothing ran: all 2 instance(s) of the report were skipped" in out
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["ok"] is False and doc["counts"]["unchanged"] == 2
    # No policy key allows it.
    assert gate.main([str(rep), str(base), "--policy", "nothing_ran=ok"]) == 2
    assert "unknown gate category 'nothing_ran'" in capsys.readouterr().err
    res = run_pytest(tmp_path, "c.yaml", "-q", "--baseline", str(base))
    assert res.returncode == NOTHING_RAN_EXIT, res.stdout[-2000:]
    assert "collective-gate: FAIL: nothing_ran" in res.stdout
    # A report that holds no instance at all, against a baseline that holds none either.
    assert run_pytest(tmp_path, "c.yaml", "-k", "nothing", "-q").returncode == NOTHING_RAN_EXIT
    empty = tmp_path / "empty.json"
    assert gate.main([str(rep), str(empty), "--update"]) == 0
    capsys.readouterr()
    assert gate.main([str(rep), str(empty), "--pytest-status", "5"]) == 1
    assert "the report holds no instance" in capsys.readouterr().out


def test_the_gate_refuses_an_old_pass_over_skips_and_a_status_5_over_a_real_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A report written before NOTHING RAN existed says PASS over skipped records: the gate
    recomputes the verdict from the records. And pytest's status 5 beside a report whose
    instances ran means the report is not that run's."""
    write_case_file(tmp_path, SKIPPED)
    run_pytest(tmp_path, "c.yaml", "-q")
    rep, base = tmp_path / "reports" / "conformance.json", tmp_path / "base.json"
    assert gate.main([str(rep), str(base), "--update"]) == 0
    doc = json.loads(rep.read_text())
    doc["summary"].update(verdict="PASS", ok=True)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    capsys.readouterr()
    assert gate.main([str(old), str(base)]) == 1
    out = capsys.readouterr().out
    assert "the summary's verdict is PASS but the records give NOTHING RAN" in out
    assert "FAIL: nothing ran" in out
    write_case_file(tmp_path, MIXED)
    assert run_pytest(tmp_path, "c.yaml", "-q").returncode == 0
    assert gate.main([str(rep), str(base), "--update"]) == 0
    capsys.readouterr()
    assert gate.main([str(rep), str(base), "--pytest-status", "0"]) == 0
    assert gate.main([str(rep), str(base), "--pytest-status", "5"]) == 1
    assert "pytest exited with status 5 (nothing ran) but the report holds 1" in (
        capsys.readouterr().out)


# -- external mode -------------------------------------------------------------------------------

def test_external_mode_gives_the_same_verdicts(tmp_path: Path) -> None:
    """One launched rank on the file whose instances all skip: the report says NOTHING RAN,
    as pytest's does; an unknown --backend stops every rank with the same one line."""
    write_case_file(tmp_path, SKIPPED)
    res = finish(start(tmp_path, [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        "-m", "harness.external", "c.yaml", "--report-json", "r.json", "--report-md", "r.md"]),
        240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    external = load_report(tmp_path / "r.json")["summary"]
    assert external["verdict"] == "NOTHING RAN", external
    assert f"(external, 1 ranks): {external['headline']}" in res.stdout
    assert run_pytest(tmp_path, "c.yaml", "-q").returncode == NOTHING_RAN_EXIT
    assert summary(tmp_path)["verdict"] == external["verdict"]

    env = subprocess_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    bad = subprocess.run([PYTHON, "-m", "harness.external", "c.yaml", "--backend", "glo",
                          "--report-json", "b.json", "--report-md", "b.md"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=HANG_S, env=env)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1].startswith(
        "python -m harness.external: --backend 'glo' is not a backend torch has built in")
    assert "did you mean 'gloo'?" in bad.stderr and "Traceback" not in bad.stderr
    assert load_report(tmp_path / "b.json")["summary"]["verdict"] == "INCOMPLETE"
