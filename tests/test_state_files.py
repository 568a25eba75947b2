"""External mode's state directory: data only, checked on load, never an older PASS.

Issue 22, points 1, 3 and 4: a rank's result of the round in flight is JSON (a pickle placed in
the shared state directory must not run code in rank 0), every file read back from there is
checked, and a resumed run whose state cannot be used stops with one line naming the file,
leaving an INCOMPLETE report rather than the earlier PASS.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.external.progress import State, StateError, recovered_run
from harness.external.resultfile import Pending, ResultFileError, dump_result, load_result
from harness.model import RankResult, StepEvent, TensorCheck

from .helpers import (
    HANG_S,
    PYTHON,
    case_instances,
    free_port,
    load_report,
    subprocess_env,
    write_case_file,
)

ONE_CASE = """
cases:
  - name: one
    op: all_reduce
    world_size: 1
    shape: [2]
    input: "i"
"""


RESULT = RankResult(
    rank=1, status="ok",
    checks=[TensorCheck("t", False, "auto", wrong=1, total=4,
                        first_wrong=[(0, "1.0", "2.0")], digest="ab12")],
    events=[StepEvent(0, "all_reduce(tensor=t)", 0.001, 0.002, completed_at_return=False)],
    duration=0.5, ordering={"probes": {"post_wait": {"ok": True}}}, perf={"t": [1.0, 2.0]},
    timing={"host": "h"}, step_errors=[{"step": 0, "raised": False}])


class Payload:
    """Unpickling this runs a command: what a hostile state directory would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_result_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "r.pending"
    path.write_bytes(dump_result(Pending(3, 7, 12, 0.25, RESULT)))
    got = load_result(path)
    assert (got.rank, got.round, got.index, got.elapsed) == (3, 7, 12, 0.25)
    assert got.result == RESULT


@pytest.mark.parametrize(("content", "says"), [
    (b"[" * 60000, "not a readable result file"),
    ('{"format": "x"}'.encode("utf-16"), "not a readable result file"),
    (b'{"format": "collective-harness rank result", "rank": 1', "not a readable result file"),
    (b'{"format": "collective-harness rank result", "rank": "1", "round": 0, "index": 0, '
     b'"elapsed": 0, "result": {}}', "rank: expected int"),
    (b'{"format": "collective-harness rank result", "rank": 1, "round": 0, "index": 0, '
     b'"elapsed": 0, "result": {"rank": 0, "status": "great"}}', "status"),
    (b'{"format": "collective-harness rank result", "rank": 1, "round": 0, "index": 0, '
     b'"elapsed": 0, "result": {"rank": 0, "status": "ok", "checks": [{"tensor": "t", '
     b'"ok": "yes", "expectation": "auto"}]}}', r"checks\[0\]\.ok: expected bool"),
    (b'{"format": "collective-harness rank result", "rank": 1, "round": 0, "index": 0, '
     b'"elapsed": 0, "result": {"rank": 0, "status": "ok", "evil": 1}}', "unknown field"),
])
def test_a_file_that_is_not_a_result_is_refused(tmp_path: Path, content: bytes,
                                                says: str) -> None:
    path = tmp_path / "r.pending"
    path.write_bytes(content)
    with pytest.raises(ResultFileError, match=says) as exc:
        load_result(path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_a_directory_is_not_a_result(tmp_path: Path) -> None:
    with pytest.raises(ResultFileError, match="not a readable result file"):
        load_result(tmp_path)


def test_a_pickle_in_the_state_directory_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    state = State(str(tmp_path / "state"), "fp", "run", rank=0, local_rank=0, attempt=1)
    state.root.mkdir()
    (state.root / "rank0.a0.trace").write_text("0 3 0\n")
    (state.root / "rank0.a0.pending").write_bytes(pickle.dumps(Payload(marker)))
    [info] = state.previous(3)
    assert not marker.exists()
    assert "pending" not in info and "not a readable result file" in info["unreadable"]
    (inst,) = case_instances(ONE_CASE)
    run = recovered_run(inst, (0,), {0: info})
    assert run is not None and run.kind == "crash"  # judged without it: it cannot pass
    assert "could not be used" in run.states[0].stderr_tail


def test_a_result_written_by_a_rank_is_read_back(tmp_path: Path) -> None:
    state = State(str(tmp_path / "state"), "fp", "run", rank=0, local_rank=0, attempt=0)
    state.reset()
    state.trace(3, 1)
    state.save_pending(3, 5, RESULT, 0.5)
    later = State(str(tmp_path / "state"), "fp", "run", rank=0, local_rank=0, attempt=1)
    [info] = later.previous(3)
    assert info["pending"] == (5, RESULT, 0.5)


@pytest.mark.parametrize("line", ["[" * 60000, '"text"', '{"round": "1", "records": []}',
                                  '{"round": 1, "records": [5]}', '{"attempt": true}'])
def test_a_progress_file_that_is_not_ours_is_a_state_error(tmp_path: Path, line: str) -> None:
    state = State(str(tmp_path / "state"), "fp", "run", rank=0, local_rank=0, attempt=0)
    state.reset()
    with open(state.root / "progress.jsonl", "a") as fh:
        fh.write(line + "\n")
    with pytest.raises(StateError, match=r"progress.jsonl:2: "):
        state.load()


def _external(where: Path, *extra: str, report: str = "r.json"
              ) -> subprocess.CompletedProcess[str]:
    """One rank, no launcher: the environment torchrun would give a world of one."""
    env = subprocess_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(free_port()))
    return subprocess.run([PYTHON, "-m", "harness.external", "c.yaml", "--report-json",
                           report, "--report-md", "r.md", "--deadline", "60", *extra],
                          cwd=where, env=env, capture_output=True, text=True, timeout=HANG_S)


def test_a_resume_from_a_broken_state_stops_and_leaves_no_pass(tmp_path: Path) -> None:
    write_case_file(tmp_path, ONE_CASE)
    first = _external(tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert load_report(tmp_path / "r.json")["summary"]["verdict"] == "PASS"
    progress = tmp_path / "reports" / ".external-state" / "progress.jsonl"
    header = progress.read_text().splitlines()[0]
    progress.write_text(header + "\n" + "[" * 60000 + "\n")
    res = _external(tmp_path, "--resume")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "progress.jsonl:2" in ln]
    assert len(lines) == 1 and "not a JSON line" in lines[0]
    rep = load_report(tmp_path / "r.json")
    assert rep["summary"]["verdict"] == "INCOMPLETE"
    assert "Verdict: PASS" not in (tmp_path / "r.md").read_text()


def test_no_pickle_is_read_from_the_state_directory() -> None:
    """The state directory's readers use no pickle at all (the pool's pipes, between
    processes the harness itself started, are not files anyone else can write)."""
    root = Path(__file__).resolve().parents[1] / "harness" / "external"
    for name in ("progress.py", "resultfile.py", "session.py", "launch.py", "cli.py"):
        tree = ast.parse((root / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {"pickle", "cPickle", "dill", "marshal"} & imported, name


def test_an_external_run_refuses_an_unusable_report_path(tmp_path: Path) -> None:
    write_case_file(tmp_path, ONE_CASE)
    (tmp_path / "afile").write_text("x")
    res = _external(tmp_path, report="afile/r.json")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "afile is a file, not a folder" in res.stderr


# -- the state directory itself, and records read back from it --------------------------------

def _resumable(tmp_path: Path) -> State:
    """A state directory with a header and a launch, as a run that stopped leaves it."""
    state = State(str(tmp_path / "state"), "fp", "run", rank=0, local_rank=0, attempt=0)
    state.reset()
    state.started()
    return state


@pytest.mark.parametrize("record", [
    {"key": "x", "outcome": "passed"},  # a record lacking every other field
    {**{k: "x" for k in ("key", "nodeid", "file", "case", "id", "backend", "dtype", "op",
                         "family", "outcome", "expected", "message")},
     "line": "1", "device": "cpu", "world_size": 1, "ranks": [], "axes": {}},  # line: a str
])
def test_a_round_whose_records_are_not_report_records_is_a_state_error(
        tmp_path: Path, record: dict[str, Any]) -> None:
    state = _resumable(tmp_path)
    with open(state.root / "progress.jsonl", "a") as fh:
        fh.write(json.dumps({"round": 0, "records": [record]}) + "\n")
    with pytest.raises(StateError, match=r"progress.jsonl:3: record 0: "):
        state.load()


@pytest.mark.parametrize("make", ["directory", "utf16", "truncated"])
def test_an_unreadable_round_in_flight_is_a_state_error(tmp_path: Path, make: str) -> None:
    state = _resumable(tmp_path)
    target = state.root / "inflight.json"
    if make == "directory":
        target.mkdir()
    else:
        text = json.dumps({"round": 0, "attempt": 0, "retry": False, "slots": [[0, [0]]]})
        target.write_bytes(text.encode("utf-16") if make == "utf16" else text[:20].encode())
    with pytest.raises(StateError, match=r"inflight.json: not the round in flight"):
        state.load()


def test_a_folder_the_harness_did_not_write_is_never_emptied(tmp_path: Path) -> None:
    """A --state-dir given by mistake (the project, a home directory) is refused: a reset
    removes only the files this harness names, and never anything else."""
    (tmp_path / "mine.txt").write_text("keep me")
    state = State(str(tmp_path), "fp", "run", rank=0, local_rank=0, attempt=0)
    with pytest.raises(StateError, match=r"holds files this harness did not write \('mine.txt'\)"):
        state.reset()
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    # The harness's own files are replaced as before.
    ours = _resumable(tmp_path / "ours")
    (ours.root / "rank1.a0.trace").write_text("1 0 0\n")
    ours.reset()
    assert sorted(p.name for p in ours.root.iterdir()) == ["progress.jsonl"]


@pytest.mark.parametrize("state_dir", ["afile", "afile/sub"])
def test_a_state_dir_that_cannot_be_a_folder_stops_with_one_line(tmp_path: Path,
                                                                 state_dir: str) -> None:
    write_case_file(tmp_path, ONE_CASE)
    (tmp_path / "afile").write_text("x")
    res = _external(tmp_path, "--state-dir", state_dir)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "Error: [Errno" not in res.stderr
    [line] = [ln for ln in res.stderr.splitlines() if "--state-dir" in ln]
    assert f"--state-dir {state_dir}: " in line
    assert "not a folder" in line or "Not a directory" in line, line
    assert load_report(tmp_path / "r.json")["summary"]["verdict"] == "INCOMPLETE"


# Imported by every rank after rank 0 wrote its INCOMPLETE report: the report folder becomes
# a file, so every later write to the report paths fails.
BREAK_REPORTS = """
import pathlib, shutil
out = pathlib.Path("out")
if out.is_dir():
    shutil.rmtree(out)
    out.write_text("the folder became a file during the run")
"""


def test_an_external_report_path_that_breaks_during_the_run_loses_no_record(
        tmp_path: Path) -> None:
    write_case_file(tmp_path, ONE_CASE)
    (tmp_path / "breakout.py").write_text(BREAK_REPORTS)
    res = _external(tmp_path, "--report-json", "out/r.json", "--report-md", "out/r.md",
                    "--backend-module", "breakout")
    assert res.returncode == 0, res.stdout + res.stderr  # the run itself completed
    assert "Traceback" not in res.stderr
    [line] = [ln for ln in res.stderr.splitlines() if "could not write the report" in ln]
    assert line.startswith("python -m harness.external: could not write the report to "
                           "out/r.json (")
    folder = Path(line.rsplit(" it is written to ", 1)[1].removesuffix(" instead"))
    try:
        rep = load_report(folder / "r.json")
        assert rep["summary"]["verdict"] == "PASS" and len(rep["records"]) == 1
        assert (folder / "r.md").read_text().count("Verdict: PASS") == 1
        assert f"report: {folder / 'r.json'}" in res.stdout
    finally:
        shutil.rmtree(folder)
    assert not list(tmp_path.rglob(".tmp-*"))
