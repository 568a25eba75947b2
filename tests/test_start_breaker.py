"""A backend whose process group cannot start is tried a few times, not once per instance.

The start breaker (:mod:`harness.runner.starts`): pools of one family that fail to start with
the same error ``STRIKES`` times in a row stop being started; every later instance that needs
such a pool gets one skip record, blocked, that quotes the error; the session says so in one
line. Through pytest, the fuzzer's executor and ``collective-certify`` (one runner); a start
that fails once and then succeeds trips nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.certify import cells
from harness.fuzz.execute import Executor
from harness.run.pool import PoolKey, PoolStartError
from harness.runner.starts import BLOCKED, STRIKES, StartBreaker
from tests.helpers import HANG_S

REPO = Path(__file__).resolve().parent.parent
N = 40
SAID = "collective-harness: pool start:"  # the one line of the session


AHEAD = 2  # --ahead: isolated instances start their pools this many at a time


def library(where: Path, isolate: bool = False) -> Path:
    """N one-instance all_reduce cases at world size 2: every one needs a pool of one family
    (its own private one, each, with ``isolate``)."""
    path = where / "forty.yaml"
    path.write_text("cases:\n" + "".join(
        f"  - {{name: c{i}, op: all_reduce, world_size: 2, input: 'rank', shape: [{i + 1}],"
        f" isolate: {str(isolate).lower()}}}\n" for i in range(N)))
    return path


def run(where: Path, *args: str, mode: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``args`` under python with the dead backend in ``mode``; the output and how many
    pools were started (rank 0 writes a line per start)."""
    log = where / "starts.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DEAD_START": mode,
           "DEAD_START_LOG": str(log)}
    proc = subprocess.run([sys.executable, *args], cwd=where, env=env, capture_output=True,
                          text=True, errors="replace", timeout=HANG_S, check=False)
    starts = len(log.read_text().splitlines()) if log.exists() else 0
    return proc, starts


def pytest_session(where: Path, mode: str, isolate: bool = False
                   ) -> tuple[subprocess.CompletedProcess[str], int, dict[str, Any]]:
    proc, starts = run(where, "-m", "pytest", str(library(where, isolate)), "-q", "-p",
                       "no:cacheprovider", f"--ahead={AHEAD}", "--rootdir", str(where),
                       "--report-json=r.json",
                       "--report-md=r.md", "--report-html=r.html", "--backend-module",
                       "tests.dead_start_backend", "--backend", "deadstart", mode=mode)
    assert (where / "r.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, starts, json.loads((where / "r.json").read_text())


@pytest.mark.parametrize("isolate", [False, True], ids=["shared", "isolated"])
def test_a_backend_that_never_starts_is_tried_strikes_times_and_said_once(
        tmp_path: Path, isolate: bool) -> None:
    """Shared: one pool started again after each failure. Isolated: private pools started
    ahead of their turn from threads, some still starting when the breaker trips."""
    proc, starts, report = pytest_session(tmp_path, "always", isolate)
    recs = report["records"]
    # Every instance has exactly one record, whatever stopped it.
    assert sorted(r["case"] for r in recs) == sorted(f"c{i}" for i in range(N))
    # A few pool starts, not one per instance (40 before the breaker).
    assert STRIKES <= starts <= STRIKES + (AHEAD if isolate else 0), starts
    errors = [r for r in recs if r["outcome"] == "error"]
    blocked = [r for r in recs if r["outcome"] == "skipped"]
    # Isolated: an item whose start was under way when the breaker tripped keeps its error.
    assert STRIKES <= len(errors) <= STRIKES + (AHEAD if isolate else 0)
    assert len(errors) + len(blocked) == N
    assert all("daemonic processes are not allowed to have children" in r["message"]
               for r in errors)
    # One reason for all of them: blocked, quoting the error, naming the pool.
    reasons = {r["reason"] for r in blocked}
    assert len(reasons) == 1, reasons
    (reason,) = reasons
    assert reason.startswith("blocked: ") and "daemonic processes" in reason
    assert "deadstart process group of 2 rank(s) on cpu" in reason
    assert all(cells.status(r) == "blocked" for r in blocked)
    # Never a PASS: the session fails, and says it in one line.
    assert proc.returncode != 0
    assert report["summary"]["verdict"] != "PASS"
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith(SAID)]
    assert len(said) == 1, proc.stdout[-3000:]
    assert f"{STRIKES} times in a row" in said[0] and "daemonic processes" in said[0]
    # The Markdown report lists the blocked instances in one line.
    md = (tmp_path / "r.md").read_text()
    assert len([ln for ln in md.splitlines() if "blocked: " in ln]) == 1
    assert f"{len(blocked)} x blocked: " in md


def test_a_start_that_fails_once_only_runs_everything(tmp_path: Path) -> None:
    proc, starts, report = pytest_session(tmp_path, "first")
    outcomes = [r["outcome"] for r in report["records"]]
    assert outcomes.count("error") == 1 and outcomes.count("passed") == N - 1, outcomes
    assert starts == 2  # the failed start, then one pool for everything after it
    assert not [ln for ln in proc.stdout.splitlines() if ln.startswith(SAID)]


def test_the_fuzzers_executor_stops_starting_the_pool_too(tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    ex = Executor("deadstart", ("tests.dead_start_backend",), deadline_s=5.0,
                  env=(("DEAD_START", "always"), ("DEAD_START_LOG", str(log))))
    doc = ("cases:\n  - {name: c, op: all_reduce, world_size: 2, input: 'rank', "
           "shape: [2]}\n")
    try:
        ran = [ex.run_text(doc) for _ in range(STRIKES + 3)]
    finally:
        ex.close()
    assert [r.outcome for r in ran] == ["error"] * STRIKES + ["skipped"] * 3
    assert ran[-1].message.startswith("blocked: ") and "daemonic" in ran[-1].message
    assert len(log.read_text().splitlines()) == STRIKES
    assert len(ex.runner.news()) == 1


def test_certify_refuses_a_backend_whose_groups_never_start(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("backend: deadstart\nmodule: tests.dead_start_backend\n")
    proc, starts = run(tmp_path, "-m", "harness.certify", "--manifest", "m.yaml", "--cases",
                       str(library(tmp_path)), "--out", "out", "--no-reference", mode="always")
    ident = json.loads((tmp_path / "out" / "identity.json").read_text())["records"]
    # The library's 40 instances start STRIKES pools; the identity session's few, one each
    # at most (a breaker of its own).
    assert starts <= STRIKES + len(ident), (starts, len(ident))
    cert = json.loads((tmp_path / "out" / "certificate.json").read_text())
    assert cert["level"] == "none" and proc.returncode == 1, proc.stdout[-3000:]
    assert any("over the skip budget" in why for why in cert["why"]), cert["why"]
    # The first line is the identity probes', with the start's error as its evidence.
    assert cert["why"][0].startswith("identity: ") and "daemonic" in cert["why"][0]
    assert cert["statuses"]["blocked"] == N - STRIKES
    # The failed starts were of different cases on one pool: one cause, not one per case.
    started = [c for c in cert["causes"] if "could not start" in c["cause"]]
    assert [c["count"] for c in started] == [STRIKES], cert["causes"]
    # The library session's one line is repeated once by collective-certify.
    assert len([ln for ln in proc.stdout.splitlines() if SAID in ln]) == 1, proc.stdout
    lib = json.loads((tmp_path / "out" / "library.json").read_text())
    assert len(lib["records"]) == N


KEY = PoolKey("deadstart", "cpu", 2)
DAEMONIC = "AssertionError: daemonic processes are not allowed to have children"


def fail(rank_errors: list[str]) -> PoolStartError:
    return PoolStartError(f"could not start: {'; '.join(rank_errors)}",
                          causes=tuple(rank_errors))


def test_the_same_error_in_a_row_trips_and_anything_else_does_not() -> None:
    b = StartBreaker()
    # The ranks that fail first differ from one try to the next: the cause is the same.
    b.failed(KEY, fail([f"rank 0: {DAEMONIC}"]), "f::a")
    b.failed(KEY, fail([f"rank 1: {DAEMONIC}", "rank 0: connection reset by peer"]), "f::b")
    assert not b.blocked(KEY)
    b.started(KEY)  # a start in between: the streak is gone (a flaky start)
    b.failed(KEY, fail([f"rank 0: {DAEMONIC}"]), "f::c")
    b.failed(KEY, fail(["rank 0: RuntimeError: address in use"]), "f::d")  # another error
    b.failed(KEY, fail([f"rank 0: {DAEMONIC}"]), "f::e")
    other = PoolKey("deadstart", "cpu", 3)
    b.failed(other, fail([f"rank 2: {DAEMONIC}"]), "f::g")  # another family counts apart
    b.failed(KEY, fail([f"rank 0: {DAEMONIC}"]), "f::h")
    assert not b.blocked(KEY) and not b.news()
    b.failed(KEY, fail([f"rank 1: {DAEMONIC}"]), "f::i")
    assert b.blocked(KEY).startswith("blocked: ") and not b.blocked(other)
    assert "f::e, f::h and f::i" in b.blocked(KEY, "f::z")
    # An instance whose own start is one of the three keeps its error record (a run ahead of
    # its turn may trip the breaker before pytest reaches its item).
    assert b.blocked(KEY, "f::h") == ""
    assert b.blocked(KEY, "f::h") == b.blocked(KEY)  # once: the fuzzer reuses keys
    # An isolated pool is of the same family as the shared one.
    assert b.blocked(PoolKey("deadstart", "cpu", 2, isolated=7)) == b.blocked(KEY)
    assert len(b.news()) == 1 and b.news() == []


def test_a_family_stopped_for_a_cause_stops_another_of_its_backend_at_its_first_failure(
        ) -> None:
    # A rendezvous that never completes costs a startup timeout per try: three tries in each
    # of a library's 20 families would be hours. One family stopped is evidence enough.
    b = StartBreaker()
    for i in range(STRIKES):
        b.failed(KEY, fail([f"rank 0: {DAEMONIC}"]), f"f::a{i}")
    ws3, ws4 = PoolKey("deadstart", "cpu", 3), PoolKey("deadstart", "cpu", 4)
    b.started(ws4)  # a family that starts is not stopped by another's failures
    assert not b.blocked(ws3) and not b.blocked(ws4)
    b.failed(ws3, fail([f"rank 2: {DAEMONIC}"]), "f::b")
    reason = b.blocked(ws3)
    assert reason.startswith(BLOCKED) and "the error that stopped the deadstart process group "\
        "of 2 rank(s)" in reason and "(f::b)" in reason, reason
    assert b.blocked(ws3, "f::b") == ""  # its own failed start keeps its error record
    assert not b.blocked(ws4)
    # Another error in another family, or the same error on another backend: three tries.
    ws5, gloo = PoolKey("deadstart", "cpu", 5), PoolKey("gloo", "cpu", 2)
    b.failed(ws5, fail(["rank 0: RuntimeError: address in use"]), "f::c")
    b.failed(gloo, fail([f"rank 0: {DAEMONIC}"]), "f::d")
    assert not b.blocked(ws5) and not b.blocked(gloo)
    assert len(b.news()) == 2


def test_a_blocked_start_counts_against_the_skip_budget() -> None:
    rec = {"key": "f::c[x]", "case": "c", "id": "x", "op": "all_reduce", "dtype": "float32",
           "outcome": "skipped", "message": "",
           "reason": f"{BLOCKED}the deadstart process group of 2 rank(s) on cpu could not "
                     "start 3 times in a row"}
    assert cells.status(rec) == "blocked"
    assert cells.skip_share([rec, {**rec, "outcome": "passed", "reason": ""}]) == (1, 2)
    # What the hang breaker blocked ran before: a broken cell, not an unstarted group.
    hung = {**rec, "reason": "blocked: op gather hung in f::a and f::b"}
    assert cells.status(hung) == "blocked" and cells.skip_share([hung]) == (0, 1)


def test_the_reason_is_one_escaped_line_whatever_the_case_and_the_ranks_said() -> None:
    key = PoolKey("deadstart", "cpu", 2, env=(("X", "a\x1b[2Jb\nc"),))
    b = StartBreaker()
    tail = f"boom\n\x1b[31m{'x' * 5000}"
    for i in range(STRIKES):
        b.failed(key, fail([f"rank 0 died while starting (exit code 1): {tail}"]), f"f::c\n{i}")
    reason = b.blocked(key)
    (line,) = b.news()
    for text in (reason, line):
        assert text.isprintable() and "\\x1b" in text and len(text) < 2000, text
