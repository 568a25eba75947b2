"""Rank pools: reuse, hang/crash/error diagnosis, isolation, and no process left behind."""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import subprocess
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.model import Instance
from harness.run.forkserver import start_child
from harness.run.pool import PoolKey, PoolManager

from .helpers import HANG_S, finish, load_report, pytest_argv, rank_pids, start, wait_for

pytest_plugins = ["pytester"]


def instances(text: str) -> list[Instance]:
    doc = yamlload.load_text(textwrap.dedent(text), "x.yaml")
    return [i for c in validate.load_cases(doc) for i in expand.expand(c, "gloo")]


def test_pools_are_reused_per_key_and_bounded() -> None:
    by_ws = {i.world_size: i for i in instances("""
    cases:
      - {name: a, op: all_reduce, world_size: [2, 3], shape: [2], input: "rank"}
    """)}
    manager = PoolManager(max_pools=1)
    pids: list[int] = []
    try:
        for ws in (2, 2, 2, 3, 2):
            key = PoolKey("gloo", "cpu", ws)
            pool = manager.get(key)
            pids += [p.pid for p in pool.procs]
            run = pool.run(by_ws[ws], deadline_s=30)
            assert run.kind == "done"
            assert all(r.status == "ok" and all(c.ok for c in r.checks)
                       for r in run.results.values())
        assert manager.started == 3  # ws2, then ws3 evicts it, then ws2 again
    finally:
        manager.close()
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in pids), HANG_S,
             "closed pools' ranks to exit")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


MIXED = """
cases:
  - name: many_passing
    op: all_reduce
    world_size: [1, 2, 3, 4]
    dtype: [float32, int32, float64]
    reduce_op: [sum, max, min]
    async: [false, true]
    params: {n: [1, 5]}
    shape: [n]
    input: "rank * 3 + i"
  - name: hangs_unexpectedly
    world_size: 2
    deadline: 1
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {op: recv, tensor: t, ranks: [1]}  # from any rank: not matched at collection
    expected: {t: 0}
  - name: aborts
    world_size: 3
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {abort: true, ranks: [2]}
      - {op: all_reduce, tensor: t}
    expected: {t: 0}
  - name: segfaults
    world_size: 2
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {segfault: true, ranks: [0]}
      - {op: all_reduce, tensor: t}
    expected: {t: 0}
  - name: exits
    world_size: 2
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {exit: 7, ranks: [1]}
      - {op: all_reduce, tensor: t}
    expected: {t: 0}
  - name: raises_on_one_rank
    world_size: 2
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {raise: "only rank 1 fails", ranks: [1]}
      - {op: all_reduce, tensor: t}
    expected: {t: 0}
  - name: expected_hang
    world_size: 2
    hangs: true
    deadline: 1
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {op: recv, tensor: t, src: 1, ranks: [0]}
    expected: {}
  - name: expected_crash
    world_size: 2
    crashes: true
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {abort: true, ranks: [0]}
    expected: {}
  - name: after_everything
    op: broadcast
    world_size: [2, 3]
    args: {src: 1}
    shape: [3]
    input: {1: [7, 8, 9], others: poison}
    expected: {others: [7, 8, 9]}
"""


def test_failures_are_diagnosed_per_rank_and_do_not_leak(pytester: pytest.Pytester) -> None:
    (pytester.path / "mixed.yaml").write_text(textwrap.dedent(MIXED))
    res = pytester.runpytest("mixed.yaml", "-q", "-p", "no:randomly")
    res.assert_outcomes(passed=144 + 2 + 2, failed=5)
    report = load_report(pytester.path / "reports" / "conformance.json")
    by_case: dict[str, Any] = {}
    for rec in report["records"]:
        by_case.setdefault(rec["case"], rec)
    hang = by_case["hangs_unexpectedly"]
    assert hang["outcome"] == "hang"
    r1 = hang["ranks"][1]
    assert r1["state"] == "blocked" and r1["step_desc"] == "recv(tensor=t)"
    assert "in recv" in r1["stack"] and hang["ranks"][0]["state"] == "finished"
    abort = by_case["aborts"]
    assert abort["outcome"] == "crash"
    assert abort["ranks"][2]["state"] == "died" and abort["ranks"][2]["signal"] == "SIGABRT"
    seg = by_case["segfaults"]
    assert seg["outcome"] == "crash" and seg["ranks"][0]["signal"] == "SIGSEGV"
    assert "Segmentation fault" in seg["ranks"][0]["stderr_tail"]
    ex = by_case["exits"]
    assert ex["outcome"] == "crash" and ex["ranks"][1]["exitcode"] == 7
    err = by_case["raises_on_one_rank"]
    assert err["outcome"] == "error"
    assert err["ranks"][1]["exception"]["message"] == "only rank 1 fails"
    assert err["ranks"][0]["state"] == "blocked" and "in all_reduce" in err["ranks"][0]["stack"]
    assert "stopped after the fail-fast grace period" in err["message"]
    assert by_case["expected_hang"]["outcome"] == "passed"
    assert by_case["expected_crash"]["outcome"] == "passed"
    assert {r["outcome"] for r in report["records"] if r["case"] in
            ("many_passing", "after_everything")} == {"passed"}
    res.stdout.fnmatch_lines(["*[[]HANG[]] mixed.yaml:*hangs_unexpectedly*no result after the "
                              "1 s deadline; rank(s) [[]1[]] blocked*"])


def test_threads_reading_a_dead_processs_exit_status_at_once_all_get_it() -> None:
    """The forkserver sends a child's exit status once, on a pipe; multiprocessing read it
    without a lock, so a second reader at the same moment met the pipe's end and recorded 255.
    In a run, the reader beside the pool's diagnosis is a run-ahead thread starting a process
    (which polls every child): a rank's ``exit: 7`` was once reported as exit code 255. Eight
    threads read at once, twenty times (with the unlocked reading most rounds lost one)."""
    for _ in range(20):
        proc = start_child(os._exit, (7,))
        multiprocessing.connection.wait([proc.sentinel])  # exited, its status on the pipe
        together = threading.Barrier(8)
        got: list[int | None] = []
        threads = [threading.Thread(target=_read_exitcode, args=(proc, together, got))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [7] * 8 and proc.exitcode == 7


def _read_exitcode(proc: Any, together: threading.Barrier, got: list[int | None]) -> None:
    together.wait()
    got.append(proc.exitcode)


def start_hanging_session(tmp_path: Path, marker: str, *extra: str) -> subprocess.Popen[str]:
    (tmp_path / "hang.yaml").write_text(textwrap.dedent("""
    cases:
      - name: stuck
        world_size: 2
        deadline: 300
        tensors: {t: {shape: [2], init: zeros}}
        steps:
          - {op: recv, tensor: t, ranks: [1]}  # from any rank: not matched at collection
          - {op: recv, tensor: t, ranks: [0]}
        expected: {t: 0}
    """))
    return start(tmp_path, pytest_argv("hang.yaml", "-q", "--no-report", *extra),
                 merge_stderr=True, COLLECTIVE_TEST_MARKER=marker)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_no_rank_outlives_a_killed_pytest(tmp_path: Path, sig: signal.Signals) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    proc = start_hanging_session(tmp_path, marker)
    try:
        wait_for(lambda: len(rank_pids(marker)) == 2, HANG_S, "two ranks to start")
        proc.send_signal(sig)
        proc.wait(timeout=HANG_S)
        wait_for(lambda: not rank_pids(marker), HANG_S, f"ranks to exit after {sig.name}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_no_rank_outlives_a_killed_xdist_worker(tmp_path: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    proc = start_hanging_session(tmp_path, marker, "-n", "1")
    try:
        wait_for(lambda: len(rank_pids(marker)) == 2, HANG_S, "two ranks to start")
        ranks = rank_pids(marker)
        worker = _parent_of_forkserver_parent(ranks[0])
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: not any(_alive(p) for p in ranks), HANG_S, "the worker's ranks to exit")
    finally:
        proc.kill()
        proc.communicate()
    wait_for(lambda: not rank_pids(marker), HANG_S, "all ranks to exit")


def _parent_of_forkserver_parent(pid: int) -> int:
    """A rank's parent is the forkserver; the forkserver's parent is the pytest process."""
    def ppid(p: int) -> int:
        with open(f"/proc/{p}/stat") as fh:
            return int(fh.read().split(") ", 1)[1].split()[1])
    return ppid(ppid(pid))


def test_two_sessions_at_once_do_not_collide(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(textwrap.dedent("""
    cases:
      - name: s
        op: all_reduce
        world_size: [2, 3]
        reduce_op: [sum, max]
        async: [false, true]
        shape: [16]
        input: "rank + i"
    """))
    procs = [start(tmp_path, pytest_argv("c.yaml", "-q", "--report-json", f"r{k}.json",
                                         "--report-md", f"r{k}.md"), merge_stderr=True)
             for k in range(2)]
    outs = [p.communicate(timeout=HANG_S)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
        assert "8 passed" in out
    for k in range(2):
        assert load_report(tmp_path / f"r{k}.json")["summary"]["passed"] == 8


def test_kill_closes_each_pipe_once_whoever_calls_it() -> None:
    """A run-ahead thread and the session's close may kill the same pool at once; a pipe
    closed twice could close a descriptor that another thread opened in between (and raised
    EBADF out of the session's end, which then lost its report)."""
    manager = PoolManager(max_pools=1)
    pool = manager.get(PoolKey("gloo", "cpu", 2))
    pids = [p.pid for p in pool.procs]
    conn = pool.conns[0]
    real_close = conn.close
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_close() -> None:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            entered.set()
            release.wait(HANG_S)
        real_close()

    conn.close = slow_close
    first = threading.Thread(target=pool.kill, name="first")
    second = threading.Thread(target=pool.kill, name="second")
    try:
        first.start()
        assert entered.wait(HANG_S)
        second.start()
        second.join(0.5)  # it must wait for the first kill, not close the pipe itself
        assert calls == ["first"]
        release.set()
        first.join(30)
        second.join(30)
        pool.kill()  # and once more, later: nothing left to do
        assert calls == ["first"]
        assert not pool.alive
    finally:
        release.set()
        manager.close()
    wait_for(lambda: not any(_alive(p) for p in pids), HANG_S, "the killed pool's ranks to exit")


CLOSE_FAILS = """
import harness.run.pool as pool

def _fails(self):
    raise OSError(9, "Bad file descriptor")

pool.RankPool.close = _fails
"""


def test_a_session_whose_pools_fail_to_close_still_reports_and_leaves_nothing(
        tmp_path: Path) -> None:
    """Closing the pools raised at the session's end: the report is still written (with the
    record of what ran), says the session did not end cleanly, is not PASS, and every rank
    is killed anyway; no traceback."""
    marker = f"marker-{uuid.uuid4().hex}"
    (tmp_path / "conftest.py").write_text(CLOSE_FAILS)
    (tmp_path / "c.yaml").write_text(textwrap.dedent("""
    cases:
      - {name: a, op: all_reduce, world_size: 2, shape: [2], input: "rank"}
    """))
    proc = start(tmp_path, pytest_argv("c.yaml", "-q", "-p", "no:randomly",
                                       "--report-json", "r.json"),
                 merge_stderr=True, COLLECTIVE_TEST_MARKER=marker)
    res = finish(proc, HANG_S)
    assert res.returncode not in (0, 1), res.stdout  # pytest's INTERNAL_ERROR
    assert "Traceback" not in res.stdout, res.stdout
    wait_for(lambda: not rank_pids(marker), HANG_S, "the ranks to be killed anyway")
    report = load_report(tmp_path / "r.json")
    assert [r["outcome"] for r in report["records"]] == ["passed"]
    assert report["session"]["complete"] is False
    assert "harness error while stopping the ranks: OSError" in report["session"]["ended_by"]
    assert report["summary"]["verdict"] != "PASS"
