"""After a rank raises, ranks provably stranded in a collective end the grace early; nothing
else does (issue 25: the fail-fast grace was a third of the quick suite's time)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.model import Instance, RankResult
from harness.run import stranded
from harness.run.pool import PoolKey, PoolManager

from .helpers import HANG_S, load_report, run_pytest, wait_for

# Rank 0 (the root) rejects the float16 list against its float32 output before sending
# anything; rank 1 is already waiting in the scatter and can never receive.
SCATTER = """
cases:
  - name: scatter_mismatch
    world_size: 2
    {extra}
    tensors:
      lst_h: {{shape: [2, 3], dtype: float16, init: "i"}}
      one: {{shape: [3], dtype: float32, init: "i"}}
    steps:
      - {{op: scatter, input: lst_h, output: one, src: 0{step_extra}}}
      {wait}
    expected: {{}}
"""


def one(extra: str = "", step_extra: str = "", wait: str = "") -> Instance:
    text = SCATTER.format(extra=extra, step_extra=step_extra, wait=wait)
    doc = yamlload.load_text(textwrap.dedent(text), "x.yaml")
    [inst] = [i for c in validate.load_cases(doc) for i in expand.expand(c, "gloo")]
    return inst


def test_a_rank_stranded_in_a_collective_ends_the_grace_early() -> None:
    inst = one()
    manager = PoolManager()
    try:
        pool = manager.get(PoolKey("gloo", "cpu", 2))
        # A grace far longer than the test: only the stranded rule can end the wait early.
        run = pool.run(inst, deadline_s=120, grace_s=100)
    finally:
        manager.close()
    assert run.kind == "failfast" and run.stranded
    assert run.results[0].status == "raised" and "dtype" in run.results[0].exc_message
    [other] = [s for s in run.states if s.rank == 1]
    assert other.state == "blocked" and other.step == 0


def test_programs_the_rule_cannot_prove_keep_the_whole_grace() -> None:
    cases = {
        "async work in flight": one(step_extra=", async: true, handle: h", wait="- {wait: h}"),
        "a short process-group timeout": one(extra="pg_timeout: 5"),
        "a subgroup": one(step_extra=", group: [0, 1]"),
        "a rank-restricted step": one(step_extra=", ranks: [0, 1]"),
    }
    for why, inst in cases.items():
        assert not stranded.eligible(inst, 600.0), why
    manager = PoolManager()
    try:
        pool = manager.get(PoolKey("gloo", "cpu", 2))
        run = pool.run(cases["async work in flight"], deadline_s=60, grace_s=1.0)
    finally:
        manager.close()
    assert run.kind == "failfast" and not run.stranded


def test_stranded_needs_every_pending_rank_in_a_collective_at_or_after_the_raise() -> None:
    inst = one()
    raised = {0: RankResult(rank=0, status="raised", step=0)}
    assert stranded.stranded(inst, raised, {1: 0})
    assert not stranded.stranded(inst, raised, {1: -1})  # still building its buffers
    assert not stranded.stranded(inst, raised, {1: 1})  # checking results
    late = {0: RankResult(rank=0, status="raised", step=1)}
    assert not stranded.stranded(inst, late, {1: 0})  # it may still meet rank 0's call
    posted = {0: RankResult(rank=0, status="raised", step=0, in_flight=1)}
    assert not stranded.stranded(inst, posted, {1: 0})


BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
IDLE = "import time\ntime.sleep(30)\n"
# A rank that sleeps while a worker it started runs (torchft's BabyGloo runs collectives so).
WORKER = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BUSY!r}])\n"


def test_a_running_rank_is_never_taken_for_a_stranded_one(tmp_path: Path) -> None:
    """The process check: a rank that is still computing (on its way to raise, say) is
    running and using CPU, or its worker process is; a blocked one sleeps without any."""
    inst = one()
    raised = {0: RankResult(rank=0, status="raised", step=0)}
    # Each leads a process group, so that the worker's busy child is killed with it.
    procs = {name: subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
             for name, code in (("busy", BUSY), ("idle", IDLE), ("worker", WORKER))}
    try:
        wait_for(lambda: (stranded.process_activity(procs["idle"].pid) or ("R",))[0] == "S",
                 HANG_S, "the idle process to sleep")
        for name, settles in (("busy", False), ("idle", True), ("worker", False)):
            watch = stranded.StrandWatch(inst)
            pid = {1: procs[name].pid}
            states = [watch.settled(t, raised, {1: 0}, pid) for t in (0.0, 0.5)]
            if settles:
                assert states == [False, True], name
            else:
                # its CPU time grows between the looks (or it is seen running): never settled
                wait_for(lambda: (stranded.process_activity(procs[name].pid)  # noqa: B023
                                  or ("", 0))[1] > 0, HANG_S,
                         f"the {name} process to use CPU time")
                assert not any(watch.settled(t, raised, {1: 0}, pid)
                               for t in (1.0, 2.0, 3.0, 4.0)), name
    finally:
        for p in procs.values():
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert stranded.process_activity(procs["idle"].pid) is None  # gone: cannot be read


def test_the_message_says_why_the_other_ranks_were_stopped(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(textwrap.dedent(
        SCATTER.format(extra="", step_extra="", wait="")))
    res = run_pytest(tmp_path, "c.yaml", "-q", "--report-json", "r.json")
    assert res.returncode == 1, res.stdout
    [rec] = load_report(tmp_path / "r.json")["records"]
    assert rec["outcome"] == "error"
    assert ("other ranks (stopped once each was blocked, idle, in a collective that a rank "
            "which raised can no longer join):") in rec["message"]
    assert rec["ranks"][1]["state"] == "blocked"
