"""External mode's state directory: data only, checked on load, never an older PASS.

Issue 22, points 1, 3 and 4: a rank's result of the round in flight is JSON (a pickle placed in
the shared state directory must not run code in rank 0), every file read back from there is
checked, and a resumed run whose state cannot be used stops with one line naming the file,
leaving an INCOMPLETE report rather than the earlier PASS.
"""

from __future__ import annotations

import ast
import os
import pickle
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.model import RankResult, StepEvent, TensorCheck
from harness.run.progress import State, StateError, recovered_run
from harness.run.resultfile import Pending, ResultFileError, dump_result, load_result

from .helpers import PYTHON, case_instances, load_report, subprocess_env, write_case_file

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
    (inst,) = case_instances("""
    cases:
      - name: one
        op: all_reduce
        world_size: 1
        shape: [2]
        input: "i"
    """)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ONE_CASE = """
cases:
  - name: one
    op: all_reduce
    world_size: 1
    shape: [2]
    input: "i"
"""


def _external(where: Path, *extra: str, report: str = "r.json"
              ) -> subprocess.CompletedProcess[str]:
    """One rank, no launcher: the environment torchrun would give a world of one."""
    env = subprocess_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(_free_port()))
    return subprocess.run([PYTHON, "-m", "harness.run.external", "c.yaml", "--report-json",
                           report, "--report-md", "r.md", "--deadline", "60", *extra],
                          cwd=where, env=env, capture_output=True, text=True, timeout=240)


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
    root = Path(__file__).resolve().parents[1] / "harness" / "run"
    for name in ("progress.py", "resultfile.py", "external.py", "launch.py"):
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
