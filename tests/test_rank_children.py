"""A rank may host a backend that starts processes of its own; they end with the rank.

``tests/worker_backend.py`` starts a daemonic ``multiprocessing`` helper from each rank's
factory, as torchft's ``ProcessGroupBabyGloo`` starts its worker, and the helper never looks
at its parent. Its group forms and passes an all_reduce; and whatever ends the rank ends the
helper too: an instance that hangs past its deadline (the pool kills its ranks), a rank killed
from outside, a SIGKILLed pytest. Helpers are found by the marker in their environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.model import Instance
from harness.run import keeper
from harness.run.pool import PoolKey, PoolManager

from .helpers import (
    HANG_S,
    load_report,
    marked,
    outcomes,
    pytest_argv,
    rank_pids,
    run_pytest,
    start,
    wait_for,
    write_case_file,
)

MODULE = "tests.worker_backend"

CASES = """
cases:
  - {name: sums, op: all_reduce, world_size: 2, shape: [3], input: "rank + i"}
  - name: stuck
    world_size: 2
    deadline: 300
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {op: recv, tensor: t, ranks: [1]}  # from any rank: never sent
      - {op: recv, tensor: t, ranks: [0]}
    expected: {t: 0}
"""


def instance(name: str) -> Instance:
    doc = yamlload.load_text(textwrap.dedent(CASES), "x.yaml")
    return next(i for c in validate.load_cases(doc) if c.name == name
                for i in expand.expand(c, "worker"))


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().split(") ", 1)[1].split()[1])


def helpers(marker: str) -> dict[int, int]:
    """Live helpers (pid -> parent pid): processes carrying ``marker`` that are neither
    ranks nor keepers nor pytest's own processes."""
    found: dict[int, int] = {}
    for pid in marked(marker):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
            parent = _ppid(pid)
        except OSError:
            continue
        if not comm.startswith("coll-") and b"spawn_main" in cmdline:
            found[pid] = parent
    return found


def _kill_all(marker: str) -> None:
    for pid in marked(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_backend_that_starts_a_process_forms_and_passes(tmp_path: Path) -> None:
    write_case_file(tmp_path, CASES)
    res = run_pytest(tmp_path, "c.yaml", "-q", "-k", "sums", "--backend", "worker",
                     "--backend-module", MODULE, "--report-json", "r.json")
    assert res.returncode == 0, res.stdout[-3000:]
    assert set(outcomes(load_report(tmp_path / "r.json")).values()) == {"passed"}


def test_a_hung_instances_helpers_end_when_the_pool_kills_its_ranks() -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    manager = PoolManager()
    try:
        pool = manager.get(PoolKey("worker", "cpu", 2, (MODULE,),
                                   env=(("COLLECTIVE_TEST_MARKER", marker),)))
        ranks = {p.pid for p in pool.procs}
        wait_for(lambda: set(helpers(marker).values()) == ranks, HANG_S,
                 "a helper of each rank")
        assert pool.run(instance("sums"), deadline_s=60).kind == "done"
        run = pool.run(instance("stuck"), deadline_s=1)
        assert run.kind == "hang"
        wait_for(lambda: not helpers(marker), HANG_S, "the helpers of the killed ranks to end")
    finally:
        manager.close()
        _kill_all(marker)


def test_a_rank_that_dies_takes_its_helpers_with_it() -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    manager = PoolManager()
    try:
        pool = manager.get(PoolKey("worker", "cpu", 2, (MODULE,),
                                   env=(("COLLECTIVE_TEST_MARKER", marker),
                                        ("COLLECTIVE_HELPERS", "2"))))
        victim, survivor = (p.pid for p in pool.procs)
        wait_for(lambda: sorted(helpers(marker).values()) == sorted([victim, survivor] * 2),
                 HANG_S, "two helpers of each rank")
        os.kill(victim, signal.SIGKILL)  # nothing of the harness runs: the pool is idle
        wait_for(lambda: victim not in helpers(marker).values(), HANG_S,
                 "the dead rank's helpers to end")
        assert list(helpers(marker).values()) == [survivor, survivor]
    finally:
        manager.close()
        _kill_all(marker)


def test_nothing_a_rank_started_outlives_a_sigkilled_pytest(tmp_path: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    write_case_file(tmp_path, CASES)
    proc = start(tmp_path, pytest_argv("c.yaml", "-q", "-k", "stuck", "--no-report",
                                       "--backend", "worker", "--backend-module", MODULE),
                 merge_stderr=True, COLLECTIVE_TEST_MARKER=marker)
    try:
        wait_for(lambda: len(rank_pids(marker)) == 2 and len(helpers(marker)) == 2, HANG_S,
                 "two ranks and their helpers to start")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=HANG_S)
        wait_for(lambda: not marked(marker), HANG_S,
                 "every rank, helper, the keeper and the forkserver to end with pytest")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        _kill_all(marker)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(k) for k in fh.read().split()]


def test_a_keeper_whose_owner_died_before_it_read_still_ends_the_ranks_it_was_sent() -> None:
    """On a busy machine the owner can be killed before its keeper has read the pids in its
    pipe (or even run): the keeper reads them after the owner is gone and ends their groups."""
    rank = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    try:
        wait_for(lambda: bool(_children(rank.pid)), HANG_S, "the rank's child to start")
        [child] = _children(rank.pid)
        gone = subprocess.Popen(["true"])
        gone.wait()  # its pid names no process any more: an owner already dead
        watcher = subprocess.Popen([sys.executable, "-I", "-S", keeper.__file__, str(gone.pid)],
                                   stdin=subprocess.PIPE)
        assert watcher.stdin is not None
        watcher.stdin.write(f"{rank.pid}\n".encode())
        watcher.stdin.close()
        assert watcher.wait(timeout=HANG_S) == 0
        assert rank.wait(timeout=HANG_S) == -signal.SIGKILL
        wait_for(lambda: not os.path.exists(f"/proc/{child}"), HANG_S,
                 "the rank's child to end with its group")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()
