"""Verdict integrity at the pool: answers are bound to their instance, every rank is accounted
for in raises/hangs/crashes, and a reused pool cannot hand a later instance stale data."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.bench.overhead import bench_rejection
from harness.casefile import expand, overrides, validate
from harness.casefile import load as yamlload
from harness.model import Instance
from harness.run import forkserver
from harness.run.capabilities import probe
from harness.run.pool import ForeignAnswerError, PoolKey, PoolManager, RankPool
from harness.run.rank import encode
from harness.verdict.outcome import judge

from .helpers import load_report

pytest_plugins = ["pytester"]

KEY = PoolKey("gloo", "cpu", 2)

CASES = """
cases:
  - name: right
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
  - name: wrong
    description: a deliberately wrong expectation; must never pass
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
    expected: {others: [100, 100, 100, 100]}
  - name: rejected
    op: all_reduce
    world_size: 2
    shape: [4]
    reduce_op: bxor
    input: "rank + i"
    raises: "BXOR|non-integral|not supported"
  - name: out_of_step
    description: rank 0 leaves an all_reduce in flight, then both ranks raise
    world_size: 2
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h, ranks: [0]}
      - {raise: "giving up", ranks: [0, 1]}
    expected: {}
    raises: "giving up"
"""


def instances(text: str = CASES) -> dict[str, Instance]:
    doc = yamlload.load_text(textwrap.dedent(text), "x.yaml")
    return {i.case: i for c in validate.load_cases(doc) for i in expand.expand(c, "gloo")}


def values_ok(pool: RankPool, inst: Instance) -> bool:
    run = pool.run(inst, deadline_s=30)
    return run.kind == "done" and all(c.ok for r in run.results.values() for c in r.checks)


@pytest.fixture
def manager() -> Any:
    m = PoolManager(max_pools=1)
    yield m
    m.close()


# -- point 1: every answer is bound to its request ------------------------------------------

def test_an_unread_answer_is_never_read_as_the_next_instances(manager: PoolManager) -> None:
    inst = instances()
    pool = manager.get(KEY)
    pool.send_request("run", inst["right"])  # the parent "fails" before reading the answers
    with pytest.raises(ForeignAnswerError, match=r"request #1 .* while request #2"):
        pool.run(inst["wrong"], deadline_s=30)
    assert not pool.alive
    fresh = manager.get(KEY)
    assert fresh is not pool and manager.started == 2
    assert values_ok(fresh, inst["right"]) and not values_ok(fresh, inst["wrong"])


def test_a_request_from_another_pool_is_refused_by_the_rank(manager: PoolManager) -> None:
    inst = instances()
    pool = manager.get(KEY)
    pool.conns[1].send_bytes(encode("run", "0" * 16, 99, inst["right"]))
    with pytest.raises(ForeignAnswerError, match="rejected"):
        pool.run(inst["wrong"], deadline_s=30)
    assert not pool.alive


def test_a_parent_failure_after_the_send_discards_the_pool(manager: PoolManager,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    inst = instances()
    pool = manager.get(KEY)

    def broken_wait(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the parent failed while waiting")

    with monkeypatch.context() as m:
        m.setattr(multiprocessing.connection, "wait", broken_wait)
        with pytest.raises(RuntimeError, match="parent failed"):
            pool.run(inst["right"], deadline_s=30)
    assert not pool.alive  # its unread answers died with it
    assert not values_ok(manager.get(KEY), inst["wrong"])


@pytest.mark.parametrize("deadline", [float("nan"), float("inf"), -1.0, 0.0])
def test_a_deadline_that_cannot_be_enforced_sends_nothing(manager: PoolManager,
                                                           deadline: float) -> None:
    inst = instances()
    pool = manager.get(KEY)
    with pytest.raises(ValueError, match="positive, finite"):
        pool.run(inst["right"], deadline_s=deadline)
    assert pool.alive and pool.seq == 0  # nothing was sent, the pool is still usable
    assert not values_ok(pool, inst["wrong"])


STALE_AFTER_NAN = """
cases:
  - name: a_nan
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
    deadline: .nan
  - name: b_wrong
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
    expected: {others: [100, 100, 100, 100]}
"""


def test_nan_deadline_then_wrong_expectation_fails(pytester: pytest.Pytester) -> None:
    """The issue's reproduction: on the old pool, b_wrong read a_nan's answers and passed.
    A NaN deadline is now refused at collection, with its line, before any pool exists (the
    pool's own refusal is tested above): nothing runs, nothing is called passed."""
    (pytester.path / "stale.yaml").write_text(textwrap.dedent(STALE_AFTER_NAN))
    res = pytester.runpytest("stale.yaml", "-q", "-p", "no:randomly")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    res.stdout.fnmatch_lines(["*stale.yaml:8:*deadline*"])
    assert "passed" not in res.stdout.str().splitlines()[-1]


@pytest.mark.parametrize("value", ["inf", "-1", "nan"])
def test_bad_deadline_option_is_an_error_record(pytester: pytest.Pytester, value: str) -> None:
    """An unusable --deadline stops the session before anything runs (a usage error)."""
    (pytester.path / "c.yaml").write_text(textwrap.dedent(STALE_AFTER_NAN).replace(
        "    deadline: .nan\n", ""))
    res = pytester.runpytest("c.yaml", "-q", "-p", "no:randomly", f"--deadline={value}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--deadline*positive, finite*"])
    assert not (pytester.path / "reports" / "conformance.json").exists()


RERUN_CONFTEST = """
from harness.run.pool import RankPool

original = RankPool.run
state = {"right": None, "once": False}


def run(self, inst, deadline_s, *args, **kwargs):
    if inst.case == "right":
        state["right"] = inst
    elif inst.case == "wrong" and not state["once"] or inst.case == "always":
        # An answer for another instance waits in the pipe, as if a parent had failed
        # after sending "right" and before reading its answers.
        state["once"] = True
        self.send_request("run", state["right"])
    return original(self, inst, deadline_s, *args, **kwargs)


RankPool.run = run
"""


def test_a_foreign_answer_reruns_on_a_fresh_pool_or_is_a_harness_error(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RERUN_CONFTEST)
    (pytester.path / "c.yaml").write_text(textwrap.dedent("""
    cases:
      - {name: right, op: all_reduce, world_size: 2, shape: [4], input: "rank + i"}
      - name: wrong
        op: all_reduce
        world_size: 2
        shape: [4]
        input: "rank + i"
        expected: {others: [100, 100, 100, 100]}
      - {name: always, op: all_reduce, world_size: 2, shape: [4], input: "rank + i"}
    """))
    res = pytester.runpytest("c.yaml", "-q", "-p", "no:randomly")
    res.assert_outcomes(passed=1, failed=2)
    recs = {r["case"]: r for r in load_report(pytester.path / "reports" / "conformance.json")
            ["records"]}
    wrong = recs["wrong"]
    assert wrong["outcome"] == "failed" and wrong["pool_replaced"]
    assert "run on a fresh pool" in wrong["message"]
    assert "expected 100.0 got 1.0" in wrong["message"]
    always = recs["always"]
    assert always["outcome"] == "error"
    assert "harness error: two pools in a row" in always["message"]
    assert "nothing was judged" in always["message"]


# -- point 13: reuse after a raise, only when the group is provably in step -----------------

def test_a_rejected_call_keeps_its_pool(manager: PoolManager) -> None:
    inst = instances()
    pool = manager.get(KEY)
    pids = [p.pid for p in pool.procs]
    for name in ("rejected", "right", "rejected"):
        run = pool.run(inst[name], deadline_s=30)
        assert judge(inst[name], run, 30).outcome == "passed"
        assert manager.settle(pool, inst[name], run) == ""
        pool = manager.get(KEY)
    assert [p.pid for p in pool.procs] == pids and manager.started == 1
    assert not values_ok(pool, inst["wrong"])


def test_the_rejection_benchmark_measures_rejections_on_one_pool() -> None:
    """collective-bench's rejection figure is taken the plugin's way, on a pool that is kept
    (the time itself is the benchmark's business, not a test's)."""
    rej = bench_rejection(2, 3)
    assert rej.pools_started == 1
    assert rej.accepted_s > 0 and rej.rejected_s > 0


def test_the_health_check_catches_a_group_out_of_step(manager: PoolManager) -> None:
    inst = instances()
    pool = manager.get(KEY)
    run = pool.run(inst["out_of_step"], deadline_s=30)
    assert judge(inst["out_of_step"], run, 30).outcome == "passed"
    assert run.results[0].in_flight == 1
    # The health check alone (the reuse policy would not even ask it: work was in flight).
    why = pool.health(timeout_s=2.0)
    assert why and not pool.alive


def _case(name: str, text: str = CASES) -> str:
    """The YAML block of case ``name`` in ``text`` (to compose files in a chosen order)."""
    blocks = textwrap.dedent(text).split("\n  - name: ")
    block = next(b for b in blocks if b.split("\n", 1)[0] == name)
    return "  - name: " + block.rstrip() + "\n"


STALE_P2P = """
cases:
  - name: p2p_left
    description: rank 0 leaves an isend in flight, rank 1 an irecv, both raise
    world_size: 2
    tensors: {t: {shape: [4], init: 42}}
    steps:
      - {op: isend, tensor: t, dst: 1, ranks: [0], handle: s}
      - {op: irecv, tensor: t, src: 0, ranks: [1], handle: r}
      - {raise: "giving up"}
    expected: {}
    raises: "giving up"
  - name: p2p_after
    world_size: 2
    tensors: {t: {shape: [4], init: "7 if rank == 0 else 0"}}
    steps:
      - {op: send, tensor: t, dst: 1, ranks: [0]}
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {t: {others: 7}}
  - name: p2p_after_wrong
    description: would pass if rank 1 received the 42 that p2p_left left behind
    world_size: 2
    tensors: {t: {shape: [4], init: "7 if rank == 0 else 0"}}
    steps:
      - {op: send, tensor: t, dst: 1, ranks: [0]}
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {t: {others: 42}}
"""


def test_a_pool_holding_stale_data_cannot_give_a_wrong_verdict(pytester: pytest.Pytester) -> None:
    """Each leftover a raising instance can leave behind, followed on the same pool by a
    correct and a deliberately wrong instance: the verdicts must be passed and failed."""
    text = "cases:\n" + "".join(_case(n) for n in ("rejected", "wrong", "out_of_step",
                                                   "right", "wrong"))
    text = text.replace("- name: wrong\n", "- name: wrong_after_rejected\n", 1)
    text += "".join(_case(n, STALE_P2P) for n in ("p2p_left", "p2p_after", "p2p_after_wrong"))
    (pytester.path / "c.yaml").write_text(text)
    res = pytester.runpytest("c.yaml", "-v", "-p", "no:randomly")
    res.assert_outcomes(passed=5, failed=3)
    res.stdout.fnmatch_lines([f"c.yaml::{name}[[]* {outcome}*" for name, outcome in (
        ("rejected", "PASSED"), ("wrong_after_rejected", "FAILED"), ("out_of_step", "PASSED"),
        ("right", "PASSED"), ("wrong", "FAILED"), ("p2p_left", "PASSED"),
        ("p2p_after", "PASSED"), ("p2p_after_wrong", "FAILED"))])  # in this order, one pool
    recs = load_report(pytester.path / "reports" / "conformance.json")["records"]
    by = {r["case"]: r for r in recs}
    assert by["rejected"]["outcome"] == "passed" and not by["rejected"]["pool_replaced"]
    assert by["out_of_step"]["outcome"] == "passed" and by["out_of_step"]["pool_replaced"]
    assert by["p2p_left"]["outcome"] == "passed" and by["p2p_left"]["pool_replaced"]
    assert {by[c]["outcome"] for c in ("right", "p2p_after")} == {"passed"}
    assert {by[c]["outcome"] for c in ("wrong_after_rejected", "wrong",
                                       "p2p_after_wrong")} == {"failed"}


# -- point 5: raises / hangs / crashes account for every rank -------------------------------

EVERY_RANK = """
cases:
  - name: one_raises_other_hangs
    description: the issue's all_gather_size_mismatch, reduced
    world_size: 2
    isolate: true
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {raise: "size mismatch", ranks: [1]}
      - {op: all_reduce, tensor: t}
    expected: {}
    raises: {match: "size", ranks: [1]}
  - name: one_raises_other_hangs_as_stated
    world_size: 2
    isolate: true
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {raise: "size mismatch", ranks: [1]}
      - {op: all_reduce, tensor: t}
    expected: {}
    raises: {match: "size", ranks: [1], others: [blocked]}
  - name: every_rank_must_raise
    world_size: 2
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {raise: "size mismatch", ranks: [1]}
    expected: {}
    raises: "size"
  - name: others_may_finish
    world_size: 2
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {raise: "size mismatch", ranks: [1]}
    expected: {}
    raises: {match: "size", ranks: [1]}
  - name: other_raises_something_else
    world_size: 2
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {raise: "size mismatch", ranks: [1]}
      - {raise: "unrelated", ranks: [0]}
    expected: {}
    raises: {match: "size", ranks: [1]}
  - name: missing_rank_cannot_raise
    world_size: 2
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {raise: "size mismatch"}
    expected: {}
    raises: {match: "size", ranks: [1, 5]}
  - name: hang_with_a_raise
    world_size: 2
    hangs: true
    deadline: 2
    tensors: {t: {shape: [2], init: 1}}
    steps:
      - {raise: "not a hang", ranks: [1]}
      - {op: all_reduce, tensor: t, ranks: [0]}
    expected: {}
"""


def test_raises_and_hangs_account_for_every_rank(pytester: pytest.Pytester) -> None:
    (pytester.path / "c.yaml").write_text(textwrap.dedent(EVERY_RANK))
    res = pytester.runpytest("c.yaml", "-q", "-p", "no:randomly")
    res.assert_outcomes(passed=2, failed=5)
    by = {r["case"]: r for r in load_report(pytester.path / "reports" / "conformance.json")
          ["records"]}
    hung = by["one_raises_other_hangs"]
    assert hung["outcome"] == "hang"
    assert hung["ranks"][0]["state"] == "blocked" and hung["ranks"][1]["status"] == "raised"
    assert "rank 0 blocked in step 1 (all_reduce(tensor=t))  <- not allowed" in hung["message"]
    stated = by["one_raises_other_hangs_as_stated"]
    assert stated["outcome"] == "passed"
    assert "rank 0 blocked in step 1" in stated["message"]
    assert "rank 1 raised RuntimeError in step 0: size mismatch" in stated["message"]
    every = by["every_rank_must_raise"]
    assert every["outcome"] == "failed"
    assert "rank 0 finished  <- expected to raise" in every["message"]
    assert by["others_may_finish"]["outcome"] == "passed"
    assert "rank 0 finished" in by["others_may_finish"]["message"]
    other = by["other_raises_something_else"]
    assert other["outcome"] == "failed"
    assert "unrelated  <- does not match the pattern" in other["message"]
    missing = by["missing_rank_cannot_raise"]
    assert missing["outcome"] == "failed"
    assert "rank 5 does not exist in a world of 2  <- expected to raise" in missing["message"]
    hang = by["hang_with_a_raise"]
    assert hang["outcome"] == "error" and "while a hang was expected" in hang["message"]


def test_others_without_ranks_is_a_collection_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "c.yaml").write_text(textwrap.dedent("""
    cases:
      - name: bad
        op: all_reduce
        world_size: 2
        shape: [2]
        input: "i"
        raises: {match: "x", others: [blocked]}
    """))
    res = pytester.runpytest("c.yaml", "-q")
    res.stdout.fnmatch_lines(["*c.yaml:*'others' needs 'ranks'*"])


def test_bundled_all_gather_size_mismatch_says_what_each_rank_did(tmp_path: Path) -> None:
    """The bundled case passes only as the honest Gloo override states: rank 1 raises, rank 0
    blocks (not "raised as expected" while a rank hung)."""
    root = Path(__file__).resolve().parents[1]
    doc = yamlload.load_file(str(root / "cases" / "errors.yaml"), "cases/errors.yaml")
    (inst,) = [i for c in validate.load_cases(doc) if c.name == "all_gather_size_mismatch"
               for i in expand.expand(c, "gloo")]
    resolved = overrides.resolve(inst, probe(()).torch_version)
    manager = PoolManager(max_pools=1)
    try:
        pool = manager.isolated(KEY)
        run = pool.run(resolved, deadline_s=10)
        res = judge(resolved, run, 10)
        pool.close()
        bare = judge(inst, run, 10)  # the contract alone: every rank must raise
    finally:
        manager.close()
    assert res.outcome == "limitation", res.message  # a Gloo override declares it
    assert "rank 0 blocked" in res.message and "rank 1 raised" in res.message
    assert bare.outcome == "hang" and "rank 0 blocked" in bare.message



def test_an_interrupt_right_after_a_rank_started_still_kills_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM (raised as KeyboardInterrupt) that lands just after a rank's process started,
    before the pool had listed it, left that rank alive: multiprocessing's exit handler then
    joined it while it waited for its peer until the process-group timeout (600 s), and the
    session took ten minutes to end. The pool lists a rank before starting it."""
    real = forkserver.without_main_module

    @contextlib.contextmanager
    def then_interrupted() -> Iterator[None]:
        with real():
            yield
        raise KeyboardInterrupt("SIGTERM")  # as the handler raises it, after the start

    before = set(multiprocessing.active_children())
    monkeypatch.setattr("harness.run.pool.without_main_module", then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        RankPool(KEY)
    started = [p for p in multiprocessing.active_children() if p not in before]
    for p in started:  # never left waiting for its peer, whatever the verdict
        p.kill()
        p.join()
    assert not started, "the rank started before the interrupt was left running"
