"""The pytest plugin as a user drives it: ids, selection, skips, reports, third-party backends."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.errors import harness_frame

from .helpers import HANG_S, PYTHON, REPO, load_report, run_pytest, subprocess_env

pytest_plugins = ["pytester"]

CASES = """
cases:
  - name: sum_basic
    op: all_reduce
    world_size: [1, 2]
    dtype: [float32, int64]
    reduce_op: [sum, max]
    shape: [4]
    input: "rank * 10 + i"
  - name: bcast
    op: broadcast
    world_size: 3
    args: {src: 1}
    shape: [2]
    input: {1: [5, 6], others: poison}
    expected: {others: [5, 6]}
"""


def write(pytester: pytest.Pytester, name: str, text: str) -> Path:
    path = pytester.path / "cases" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_ids_verbose_and_reports(pytester: pytest.Pytester) -> None:
    write(pytester, "all_reduce.yaml", CASES)
    result = pytester.runpytest("cases/", "-v")
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines([
        "cases/all_reduce.yaml::sum_basic[[]gloo-ws2-int64-max-sync[]] PASSED*",
        "cases/all_reduce.yaml::bcast[[]gloo-ws3-float32-sync-src1[]] PASSED*",
        "*report written to reports*conformance.json*",
    ])
    report = load_report(pytester.path / "reports" / "conformance.json")
    assert report["summary"]["passed"] == 9 and report["summary"]["ok"] is True
    assert report["metadata"]["world_sizes"] == [1, 2, 3]
    assert report["metadata"]["torch"].startswith("2.")
    rec = next(r for r in report["records"] if r["id"] == "gloo-ws2-int64-max-sync")
    assert rec["op"] == "all_reduce" and rec["line"] == 3 and len(rec["ranks"]) == 2
    assert all(c["ok"] for r in rec["ranks"] for c in r["checks"])
    md = (pytester.path / "reports" / "conformance.md").read_text()
    assert "| all_reduce | ✅\u00a04 | ✅\u00a04 |" in md and "**Verdict: PASS**" in md


def test_selection_flags(pytester: pytest.Pytester) -> None:
    write(pytester, "all_reduce.yaml", CASES)
    pytester.runpytest("cases/", "-k", "bcast", "--no-report").assert_outcomes(passed=1)
    pytester.runpytest("cases/", "-m", "broadcast", "--no-report").assert_outcomes(passed=1)
    res = pytester.runpytest("cases/", "--world-size", "2", "--no-report")
    res.assert_outcomes(passed=4, deselected=5)
    coll = pytester.runpytest("cases/", "--collect-only", "-q")
    coll.stdout.fnmatch_lines(["cases/all_reduce.yaml::sum_basic[[]gloo-ws1-float32-sum-sync[]]",
                               "9 tests collected*"])
    assert not (pytester.path / "reports").exists()


def test_exitfirst_and_failure_message(pytester: pytest.Pytester) -> None:
    write(pytester, "bad.yaml", """
    cases:
      - name: wrong
        op: all_reduce
        world_size: 2
        shape: [4]
        input: "rank + i"
        expected: {others: "2 * i"}
      - name: later
        op: barrier
        world_size: 2
    """)
    res = pytester.runpytest("cases/", "-x", "--no-report")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines([
        # the line of the expectation that was not met, not the case's "- name:" line
        "[[]FAILED[]] cases/bad.yaml:8: wrong[[]gloo-ws2-float32-sum-sync[]]: wrong values "
        "on rank(s) 0-1",
        "  ranks 0-1, buffer 'tensor' (expr): 4 of 4 element(s) wrong (max abs error 1, max rel "
        "error *, max * ulp; compared bit for bit); first: [[]0[]] expected 0.0 got 1.0, *",
    ])


def test_collection_does_not_import_torch(tmp_path: Path) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "c.yaml").write_text(CASES)
    code = textwrap.dedent(f"""
        import sys, pytest
        pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", {str(tmp_path)!r}])
        print("TORCH_LOADED", "torch" in sys.modules)
    """)
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         timeout=HANG_S)
    assert "9 tests collected" in out.stdout
    assert "TORCH_LOADED False" in out.stdout


def test_broken_file_fails_collection_readably(pytester: pytest.Pytester) -> None:
    write(pytester, "broken.yaml", """
    cases:
      - name: a
        op: all_reduce
        input: [1]
        colour: blue
    """)
    res = pytester.runpytest("cases/")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    res.stdout.fnmatch_lines(
        ["*cases/broken.yaml:6:5: at cases[[]0[]].colour: unknown key 'colour'*"])
    assert "Traceback" not in res.stdout.str()


def test_nccl_without_gpus_skips_in_the_parent(pytester: pytest.Pytester) -> None:
    write(pytester, "all_reduce.yaml", CASES)
    pytester.makeconftest("""
        import json
        from harness.plugin import state
        def pytest_sessionfinish(session):
            hs = state.harness_session(session.config)
            with open("pools.json", "w") as fh:
                json.dump({"manager_created": hs.has_pools}, fh)
    """)
    res = pytester.runpytest("cases/", "--backend", "nccl", "-rs")
    res.assert_outcomes(skipped=9)
    res.stdout.re_match_lines(
        [r".*(no CUDA device on this machine|backend .nccl. is not available).*"])
    assert json.loads((pytester.path / "pools.json").read_text()) == {"manager_created": False}
    report = load_report(pytester.path / "reports" / "conformance.json")
    assert {r["device"] for r in report["records"]} == {"cuda"}
    assert {r["outcome"] for r in report["records"]} == {"skipped"}


def test_overrides_become_xfail_xpass_skip_and_raises(pytester: pytest.Pytester) -> None:
    write(pytester, "o.yaml", """
    cases:
      - name: known_wrong
        op: all_reduce
        shape: [2]
        input: "i"
        expected: {others: "i"}
        overrides:
          - {when: {backend: gloo}, xfail: true, reason: documented divergence}
      - name: fixed_now
        op: all_reduce
        shape: [2]
        input: "i"
        overrides:
          - {when: {backend: gloo}, xfail: true, reason: was wrong once}
      - name: avg_int
        op: all_reduce
        dtype: int64
        reduce_op: avg
        shape: [2]
        input: "i"
        overrides:
          - {when: {backend: gloo}, raises: "can't be cast|AVG", reason: Gloo has no integer AVG}
      - name: not_here
        op: barrier
        overrides:
          - {when: {backend: gloo}, skip: true, reason: skipped on purpose}
    """)
    res = pytester.runpytest("cases/", "-rxXsL")
    # A declared rejection is a limitation, not a pass: its own category everywhere.
    res.assert_outcomes(xfailed=1, xpassed=1, passed=0, skipped=1)
    res.stdout.fnmatch_lines(["LIMITATION cases/o.yaml::avg_int*Gloo has no integer AVG",
                              "*skipped on purpose*",
                              "*1 skipped, 1 xfailed, 1 xpassed, 1 limitation*"])
    report = load_report(pytester.path / "reports" / "conformance.json")
    by_case = {r["case"]: r for r in report["records"]}
    assert by_case["known_wrong"]["outcome"] == "xfail"
    assert by_case["fixed_now"]["outcome"] == "xpass"
    assert by_case["avg_int"]["outcome"] == "limitation"
    assert by_case["avg_int"]["expected"] == "raises"
    assert report["summary"]["limitation"] == 1 and report["summary"]["passed"] == 0
    # An xpass is unexpected: the verdict is not PASS.
    assert report["summary"]["verdict"] == "FAIL"
    assert "1 limitation" in report["summary"]["headline"]
    assert by_case["not_here"]["outcome"] == "skipped"
    # ... and the exit status agrees with the report (pytest alone would exit 0 on an xpass).
    assert res.ret == pytest.ExitCode.TESTS_FAILED


def run_child(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_pytest(cwd, *args, extra_env=env)


def test_third_party_backend_module(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CASES)
    ok = run_child(["c.yaml", "--backend-module", "fault_backend", "--backend", "faulty", "-q"],
                   tmp_path, COLLECTIVE_FAULT="none")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "9 passed" in ok.stdout
    bad = run_child(["c.yaml", "--backend-module", "fault_backend", "--backend", "faulty",
                     "-q", "--no-report"], tmp_path, COLLECTIVE_FAULT="wrong_value")
    assert bad.returncode == 1
    assert "c.yaml::sum_basic[faulty-ws2-float32-sum-sync]" in bad.stdout
    assert "rank 1, buffer 'tensor' (auto): 1 of 4 element(s) wrong" in bad.stdout
    report = load_report(tmp_path / "reports" / "conformance.json")
    assert report["metadata"]["options"]["backend_modules"] == ["fault_backend"]


def test_backend_module_that_fails_or_kills_its_importer(tmp_path: Path) -> None:
    """torch and --backend-module are imported in a probe process, not in pytest: a module
    that raises skips every instance with the reason, one that ends the process errors every
    instance with one line saying so; the session ends with a report either way."""
    (tmp_path / "c.yaml").write_text(CASES)
    (tmp_path / "raising_backend.py").write_text("raise ImportError('no such driver')\n")
    (tmp_path / "exiting_backend.py").write_text("import os\nos._exit(3)\n")
    path = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    raising = run_child(["c.yaml", "--backend-module", "raising_backend", "-q", "-rs"],
                        tmp_path, **path)
    assert "9 skipped" in raising.stdout, raising.stdout + raising.stderr
    assert ("--backend-module raising_backend failed to import: ImportError: no such driver"
            in raising.stdout)
    exiting = run_child(["c.yaml", "--backend-module", "exiting_backend", "-q"], tmp_path,
                        **path)
    assert exiting.returncode == 1 and "Traceback" not in exiting.stdout + exiting.stderr
    report = load_report(tmp_path / "reports" / "conformance.json")
    assert [r["outcome"] for r in report["records"]] == ["error"] * 9
    assert all("the process that imports torch and --backend-module exiting_backend to see "
               "what it offers died (exit code 3)" in r["message"] for r in report["records"])
    assert report["summary"]["verdict"] == "FAIL"


def test_xdist_two_workers_one_report(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(CASES)
    res = run_child(["c.yaml", "-n", "2", "-q"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "9 passed" in res.stdout
    report = load_report(tmp_path / "reports" / "conformance.json")
    assert report["summary"]["total"] == 9
    assert len({r["key"] for r in report["records"]}) == 9


def test_bundled_seed_cases_end_to_end(tmp_path: Path) -> None:
    """The shipped seed cases pass on Gloo at world sizes 1 to 4."""
    res = run_child([str(REPO / "cases" / "seeds.yaml"), "-q", "--report-json",
                     str(tmp_path / "r.json"), "--report-md", str(tmp_path / "r.md"),
                     "--report-html", str(tmp_path / "r.html")], REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = load_report(tmp_path / "r.json")
    assert report["metadata"]["world_sizes"] == [1, 2, 3, 4]
    assert report["summary"]["failed"] == 0 and report["summary"]["passed"] > 20
    hang = next(r for r in report["records"] if r["case"] == "a_forgot_to_send_hangs")
    assert hang["outcome"] == "passed" and hang["expected"] == "hangs"
    blocked = [r for r in hang["ranks"] if r.get("state") == "blocked"]
    assert [r["rank"] for r in blocked] == [1] and "in recv" in blocked[0]["stack"]


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="rank pools need Linux")


def test_xdist_is_a_core_dependency() -> None:
    """`pip install -e .` alone must make the README's `pytest cases/ -n 2` work."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pytest-xdist") for d in project["dependencies"])


HABITS = """
cases:
  - name: good
    op: all_reduce
    world_size: [1, 2]
    shape: [2]
    input: "rank + i"
  - name: bad
    op: broadcast
    world_size: 2
    dtype: [float32, int64]
    args: {src: 0}
    shape: [2]
    input: "i"
    expected: [7, 7]
"""


def test_quiet_report_line_starts_its_own_line(pytester: pytest.Pytester) -> None:
    write(pytester, "h.yaml", HABITS)
    result = pytester.runpytest("cases/", "-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    lines = result.stdout.lines
    written = [ln for ln in lines if "report written to" in ln]
    assert len(written) == 1 and written[0].startswith("collective-harness: report written")


def test_last_failed_failed_first_and_stepwise(pytester: pytest.Pytester) -> None:
    write(pytester, "h.yaml", HABITS)
    first = pytester.runpytest("cases/", "-q", "--no-report")
    first.assert_outcomes(passed=2, failed=2)
    lf = pytester.runpytest("cases/", "--lf", "-v", "--no-report")
    lf.assert_outcomes(failed=2)
    lf.stdout.fnmatch_lines(["*run-last-failure: rerun previous 2 failures*",
                             "*bad[[]gloo-ws2-float32-sync-src0[]] FAILED*"])
    assert "known failures not in selected tests" not in lf.stdout.str()
    ff = pytester.runpytest("cases/", "--ff", "-v", "--no-report")
    ff.assert_outcomes(passed=2, failed=2)
    ran = [ln.split(" ")[0] for ln in ff.stdout.lines if ln.startswith("cases/h.yaml::")]
    assert [r.split("::")[1].split("[")[0] for r in ran] == ["bad", "bad", "good", "good"]
    # --sw stops at the first failure and resumes from it on the next run
    sw = pytester.runpytest("cases/", "--sw", "-v", "--no-report", "-p", "no:randomly")
    sw.assert_outcomes(failed=1, passed=2)
    again = pytester.runpytest("cases/", "--sw", "-v", "--no-report")
    again.stdout.fnmatch_lines(["*stepwise: skipping 2 already passed items*"])


def test_rank_errors_grouped_without_harness_frames(pytester: pytest.Pytester) -> None:
    write(pytester, "f8.yaml", """
        cases:
          - name: f8
            op: all_reduce
            world_size: 4
            dtype: float8_e5m2
            shape: [2]
            input: "1"
        """)
    result = pytester.runpytest("cases/", "-p", "no:cacheprovider", "--no-report")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # one block for the four identical errors, naming the user's op call
    result.stdout.fnmatch_lines(["*rank(s) 0-3 raised", "*ranks 0-3: *Error: *",
                                 "*in step 0: all_reduce(tensor=tensor)*",
                                 "*harness frame(s) left out*"])
    # One traceback in the failure report (the short summary repeats the whole message where
    # pytest does not cut it, as under CI=true).
    failures = out.split("short test summary info")[0]
    assert failures.count("Traceback (most recent call last)") == 1, out
    assert "harness/program/" not in out and "harness/run/" not in out
    assert "distributed_c10d.py" in out  # torch's frames stay


def test_reduce_op_per_step_runs(pytester: pytest.Pytester) -> None:
    write(pytester, "steps.yaml", """
        cases:
          - name: mixed
            world_size: [2, 3]
            dtype: int64
            tensors:
              a: {shape: [3], init: "rank + 1 + i"}
              b: {shape: [3], init: "rank + 1 + i"}
            steps:
              - {op: all_reduce, tensor: a, reduce_op: max}
              - {op: all_reduce, tensor: b}
            expected:
              a: "world_size + i"
              b: "world_size * (world_size + 1) // 2 + world_size * i"
        """)
    result = pytester.runpytest("cases/", "-q", "-p", "no:cacheprovider", "--no-report")
    result.assert_outcomes(passed=2)


def test_every_expansion_problem_of_a_file_at_once(pytester: pytest.Pytester) -> None:
    write(pytester, "bad.yaml", """
        cases:
          - {name: a, op: broadcast, world_size: 2, args: {src: 5}, shape: [2], input: "i"}
          - {name: b, op: all_reduce, world_size: 2, shape: [2], input: {3: [1, 2]}}
        """)
    result = pytester.runpytest("cases/", "--collect-only", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "2 problem(s)" in out, out
    assert "bad.yaml:3:" in out and "bad.yaml:4:" in out


def test_value_failure_points_at_the_expected_line(pytester: pytest.Pytester) -> None:
    text = textwrap.dedent("""
        cases:
          - name: explicit
            op: broadcast
            world_size: 2
            args: {src: 0}
            shape: [2]
            input: "i"
            expected: [7, 7]
          - name: derived
            op: all_reduce
            world_size: 2
            shape: [2]
            input: "rank + i"
            expected: auto
            overrides:
              - {when: {backend: gloo}, expected: [0, 0], reason: test}
          - name: prog
            world_size: 2
            tensors:
              t: {shape: [2], init: "i"}
            steps:
              - {op: all_reduce, tensor: t}
            expected:
              t: [5, 5]
        """)
    write(pytester, "lines.yaml", text)
    lines = text.splitlines()

    def line_of(fragment: str, after: str) -> int:
        start = next(i for i, ln in enumerate(lines) if after in ln)
        return next(i for i, ln in enumerate(lines) if i > start and fragment in ln) + 1

    result = pytester.runpytest("cases/", "-p", "no:cacheprovider", "--no-report")
    out = result.stdout.str()
    assert f"cases/lines.yaml:{line_of('expected:', 'explicit')}: explicit[" in out, out
    assert f"cases/lines.yaml:{line_of('t: [5, 5]', 'prog')}: prog[" in out, out
    # the shorthand all_reduce's one buffer is named by its role, not 'input'
    assert "buffer 'tensor' (explicit)" in out and "tensor 'input'" not in out


def test_a_named_directory_of_yaml_never_collects_zero_in_silence(tmp_path: Path) -> None:
    """Issue 26, point 1: the skipped files are listed, and the printed command collects them."""
    (tmp_path / "mycases").mkdir()
    (tmp_path / "mycases" / "ar.yaml").write_text(CASES)
    (tmp_path / "mycases" / "other.yml").write_text("key: value\n")
    res = run_pytest(tmp_path, "mycases/", "--collect-only", "-q")
    assert res.returncode == pytest.ExitCode.NO_TESTS_COLLECTED
    assert ("2 YAML file(s) under the paths you named were not collected as case files: "
            "mycases/ar.yaml, mycases/other.yml") in res.stdout
    fix = next(line for line in res.stdout.splitlines() if "to collect these:" in line)
    argv = shlex.split(fix.split("to collect these: ", 1)[1])
    assert argv[0] == "pytest" and "mycases/" in argv
    assert argv[-2:] == ["-o", "collective_case_dirs=mycases"]
    again = run_pytest(tmp_path, *argv[1:])
    # As printed: the case file is collected (and other.yml is reported as a broken case file).
    assert "ar.yaml::sum_basic" in again.stdout, again.stdout
    assert "other.yml" in again.stdout


def test_unrelated_yaml_under_the_rootdir_is_not_reported(tmp_path: Path) -> None:
    (tmp_path / ".github").mkdir()
    (tmp_path / ".github" / "ci.yaml").write_text("on: push\n")
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    res = run_pytest(tmp_path, ".", "-q")
    assert res.returncode == 0, res.stdout
    assert "not collected as case files" not in res.stdout


GROUP_ERRORS = """
  - name: subgroups_too_big
    world_size: 2
    steps:
      - {new_group: mine, subgroups: 100}
    expected: {}
    raises: "not this message"
  - name: members_out_of_the_world
    world_size: 2
    steps:
      - {new_group: g, members: [0, 5]}
    expected: {}
    raises: "not this message"
  - name: split_on_gloo
    world_size: 2
    tensors: {t: {shape: [1], dtype: int64, init: "rank"}}
    steps:
      - {new_group: ng, split: [[0, 1]]}
      - {op: broadcast, tensor: t, group: ng, group_src: 0}
    expected: {t: 0}
"""

LONELY_RECV = """
  - name: lonely_recv
    world_size: 2
    deadline: 8
    tensors: {t: {shape: [2], init: 0}}
    steps:
      - {op: recv, tensor: t, ranks: [1]}  # from any rank: not matched at collection
    expected: {t: 0}
"""

WRONG_EVERYWHERE = """
  - name: wrong_everywhere
    op: all_reduce
    world_size: 4
    shape: [2]
    input: "1"
    expected: 5
"""

READ_AFTER_WAIT = """
  - name: read_after_wait
    world_size: 2
    tensors:
      t: {shape: [3], dtype: float32, init: {0: [1, 2, 3], 1: zeros}}
    steps:
      - {op: isend, tensor: t, dst: 1, ranks: [0], handle: req}
      - {op: irecv, tensor: t, src: 0, ranks: [1], handle: req}
      - {wait: req}
      - {read: t, as: after_wait, expect: [1, 2, 4], ranks: [1]}
    expected:
      t: {0: unchanged, 1: [1, 2, 3]}
"""


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One child session on a file of failing cases that four tests read, each its own
    case's lines and records (a session per test cost a pytest, a probe and a forkserver
    each): the result and the project folder. The read expectation's case comes first so
    that the line its failure names is the same in this file as in a file of its own."""
    where = tmp_path_factory.mktemp("failures")
    (where / "c.yaml").write_text("\ncases:" + READ_AFTER_WAIT + LONELY_RECV + WRONG_EVERYWHERE
                                  + GROUP_ERRORS)
    return run_pytest(where, "c.yaml", "-q", "--rootdir", str(where)), where


def failure_block(stdout: str, case: str) -> str:
    """The failure report of ``case``'s one instance in a session's output: from the line of
    underscores naming it to the next such line."""
    lines = stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("_") and f" {case}[" in ln)
    tail = next((i for i in range(head + 1, len(lines)) if lines[i].startswith("___")),
                len(lines))
    return "\n".join(lines[head:tail])


def _no_harness_frames(text: str) -> None:
    """Every frame of ``text`` is outside the harness, and a line says how many were cut."""
    frames = re.findall(r'File "([^"]+)", line \d+', text)
    assert frames and not [f for f in frames if harness_frame(f)], text
    assert re.search(r"\([1-9]\d* harness frame\(s\) left out\)", text), text
    assert "distributed_c10d.py" in text  # torch's frames stay


def test_group_step_errors_cut_the_harness_frames_everywhere(
        failures: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Issue 22, point 8: new_group / split errors, in the message and in the record.
    new_subgroups with a size over the world and new_group with a rank out of the world
    (accepted at collection because of raises:) are rejected by torch at run time on every
    torch; split_group on Gloo raises where torch cannot split a Gloo group (< 2.15)."""
    res, where = failures
    assert res.returncode == 1, res.stdout + res.stderr
    report = load_report(where / "reports" / "conformance.json")
    raised: dict[str, int] = {}
    mine = ("subgroups_too_big", "members_out_of_the_world", "split_on_gloo")
    for rec in report["records"]:
        if rec["case"] not in mine:
            continue
        if rec["outcome"] == "error":  # an unexpected error: its message has the traceback
            _no_harness_frames(rec["message"])
        for rank in rec["ranks"]:
            exc = rank.get("exception")
            if exc and exc["traceback"]:
                raised[rec["case"]] = raised.get(rec["case"], 0) + 1
                _no_harness_frames(exc["traceback"])
    assert raised.get("subgroups_too_big") == 2 and raised.get("members_out_of_the_world") == 2
    # The terminal's blocks of these cases (a hang's block, of another case here, shows the
    # blocked ranks' stacks, harness frames included).
    blocks = "\n".join(failure_block(res.stdout, case) for case in mine)
    shown = re.findall(r'File "([^"]+)", line \d+', blocks)
    assert shown and not [f for f in shown if harness_frame(f)], blocks


def test_the_missing_baseline_hint_works_when_pasted(tmp_path: Path) -> None:
    """Issue 26, point 2: the printed commands reproduce the session (its paths and -o)."""
    (tmp_path / "mycases").mkdir()
    (tmp_path / "mycases" / "ar.yaml").write_text(CASES)
    args = ["mycases/", "-o", "collective_case_dirs=mycases", "--world-size", "1", "-q"]
    res = run_pytest(tmp_path, *args, "--baseline", "base.json")
    assert res.returncode == pytest.ExitCode.USAGE_ERROR
    hint = next(ln for ln in res.stderr.splitlines() if "create it with:" in ln)
    run_cmd, gate_cmd = hint.split("create it with: ", 1)[1].rstrip(")").split(" && ")
    run_argv, gate_argv = shlex.split(run_cmd), shlex.split(gate_cmd)
    assert run_argv[0] == "pytest" and gate_argv[0] == "collective-gate"
    first = run_pytest(tmp_path, *run_argv[1:])
    assert first.returncode == 0 and "4 passed" in first.stdout, first.stdout
    made = subprocess.run([sys.executable, "-m", "harness.gate", *gate_argv[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_S,
                          env=subprocess_env())
    assert made.returncode == 0, made.stderr
    gated = run_pytest(tmp_path, *args, "--baseline", "base.json")
    assert gated.returncode == 0, gated.stdout + gated.stderr


def test_a_long_wait_is_not_silence(
        failures: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Issue 26, point 4: a recv with no send says who waits where, before the hang."""
    res = failures[0]
    assert res.returncode == 1
    lines = [ln for ln in res.stdout.splitlines() if "waiting" in ln and "lonely_recv" in ln]
    # The first note comes 5 s in; the seconds it gives are measured (more on a busy machine).
    assert lines and re.fullmatch(
        r"collective-harness: c\.yaml::lonely_recv\[gloo-ws2-float32-sync\]: waiting \d+ s: "
        r"rank 1 in step 0 \(recv\(tensor=t\)\); 1 rank\(s\) answered; \d+ s left before "
        r"the deadline declares a hang", lines[0]), res.stdout
    assert re.search(r"^\[HANG\] .*lonely_recv\[", res.stdout, re.MULTILINE), res.stdout


def test_identical_wrong_values_on_every_rank_are_one_line(
        failures: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Issue 26, point 5: 4 ranks with the same wrong value read as one line, not four."""
    res = failures[0]
    assert res.returncode == 1
    block = failure_block(res.stdout, "wrong_everywhere")
    assert "  ranks 0-3, buffer 'tensor' (explicit): 2 of 2 element(s) wrong" in block, block
    assert "  rank 1, buffer" not in block


def test_a_wrong_read_expectation_points_at_the_read_and_claims_no_more(
        failures: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Issue 26, point 5: the read step's line, and both explanations the evidence allows."""
    res = failures[0]
    assert res.returncode == 1
    want = ("[FAILED] c.yaml:11: read_after_wait[gloo-ws2-float32-async]: a read expectation "
            "was not met: either the backend made the data visible at another time than the async "
            "contract allows, or the read's expect: is not what the contract implies")
    assert want in res.stdout, res.stdout


def test_pytest_inside_ones_own_folder_of_cases_says_how_to_collect_them(
        tmp_path: Path) -> None:
    """Issue 43.1: ``pytest .`` (or a bare ``pytest``) in a folder of case files collected
    nothing and said nothing; the printed command collects them."""
    (tmp_path / "mycases").mkdir()
    (tmp_path / "mycases" / "ar.yaml").write_text(CASES)
    for args in ((".", "-q"), ("-q",)):
        res = run_pytest(tmp_path / "mycases", *args)
        assert res.returncode == pytest.ExitCode.NO_TESTS_COLLECTED
        assert "not collected as case files: ar.yaml" in res.stdout, res.stdout
        fix = next(line for line in res.stdout.splitlines() if "to collect these:" in line)
        argv = shlex.split(fix.split("to collect these: ", 1)[1])
        assert argv[-2:] == ["-o", "collective_case_dirs=mycases"]
        # Collected is what the hint promises (running the nine instances proves nothing more
        # about it, at a pool's cost per command).
        again = run_pytest(tmp_path / "mycases", *argv[1:], "--collect-only")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "ar.yaml::sum_basic[gloo-ws2-int64-max-sync]" in again.stdout, again.stdout


ONE = """
cases:
  - name: one
    op: all_reduce
    world_size: 1
    shape: [2]
    input: "i"
"""


def test_reports_land_where_pytest_was_run(tmp_path: Path) -> None:
    """Issue 43.3: with no ini file pytest's rootdir is the folder of the cases it is given,
    and the reports used to land there (`cases/reports/`) when cases were named from another
    folder. Without an ini file the default paths are relative to the current folder; with
    one, to its folder (the project); a path given on the command line to the current folder,
    as --junitxml is."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "c.yaml").write_text(ONE)
    (tmp_path / "run").mkdir()
    res = run_pytest(tmp_path / "run", "../cases/c.yaml", "-q")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "report written to reports/conformance.json, reports/conformance.md" in res.stdout
    assert (tmp_path / "run" / "reports" / "conformance.json").exists()
    assert not (tmp_path / "cases" / "reports").exists()

    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "c.yaml").write_text(ONE)
    res = run_pytest(project / "sub", "../c.yaml", "-q", "--report-json", "mine.json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "report written to mine.json, ../reports/conformance.md" in res.stdout
    assert (project / "sub" / "mine.json").exists()
    assert (project / "reports" / "conformance.md").exists()
    assert not (project / "sub" / "reports").exists()


SELECTIONS = """
cases:
  - name: quick
    op: all_reduce
    world_size: [1, 2]
    shape: [2]
    input: "i"
  - name: long
    op: all_reduce
    world_size: 1
    marks: [full]
    shape: [2]
    input: "i"
  - name: bandwidth
    op: all_reduce
    world_size: 1
    marks: [perf]
    shape: [2]
    input: "i"
  - name: other
    op: broadcast
    args: {src: 0}
    world_size: 1
    shape: [2]
    input: "i"
"""


def test_the_terminal_says_what_pytests_deselected_count_is_made_of(tmp_path: Path) -> None:
    """Issue 43.4: pytest's "N deselected" counts the long matrix together with bandwidth
    instances, --world-size and -k; the harness's line named the long matrix alone, so the
    two numbers did not add up."""
    (tmp_path / "c.yaml").write_text(SELECTIONS)
    res = run_pytest(tmp_path, "c.yaml", "-q", "--world-size", "1", "-k", "not other")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 4 deselected" in res.stdout, res.stdout
    assert ("collective-harness: 4 deselected: 1 instance(s) of the long matrix (marked "
            "'full'; add --full to run them); 1 bandwidth instance(s) (marked 'perf'; they run "
            "under --perf); 1 instance(s) at world sizes --world-size does not name; 1 by -k, "
            "-m, --deselect or another plugin") in res.stdout, res.stdout
