"""Isolated instances run ahead of their turn on their own pools (issue 25 point 3): the same
records as run in turn, one record each, and nothing left running however the session ends."""

from __future__ import annotations

import json
import signal
import textwrap
import uuid
from pathlib import Path
from typing import Any

from .helpers import (
    HANG_S,
    finish,
    load_report,
    pytest_argv,
    rank_pids,
    run_pytest,
    start,
    wait_for,
)

CASES = """
cases:
  - name: plain
    op: all_reduce
    world_size: [2, 3]
    shape: [4]
    input: "rank + i"
  - name: declared_hang
    world_size: 2
    hangs: true
    deadline: 2
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {}
  - name: declared_crash
    world_size: 2
    crashes: true
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {segfault: true, ranks: [1]}
    expected: {}
  - name: unexpected_hang
    world_size: 2
    isolate: true
    deadline: 2
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {op: recv, tensor: t, ranks: [1]}  # from any rank: not matched at collection
    expected: {t: 0}
  - name: groups
    world_size: 3
    tensors: {t: {shape: [2], init: "rank"}}
    steps:
      - {new_group: g, members: [0, 1]}
      - {op: all_reduce, tensor: t, group: g, ranks: [0, 1]}
    expected: {t: {0: 1, 1: 1, 2: 2}}
"""


def records(tmp_path: Path, ahead: str) -> dict[str, dict[str, Any]]:
    where = tmp_path / f"ahead{ahead}"
    where.mkdir()
    (where / "c.yaml").write_text(textwrap.dedent(CASES))
    res = run_pytest(where, "c.yaml", "-q", "-p", "no:randomly", "--ahead", ahead,
                     "--report-json", "r.json")
    assert res.returncode == 1, res.stdout  # the unexpected hang
    return {r["key"]: r for r in load_report(where / "r.json")["records"]}


def test_run_ahead_gives_the_records_of_a_run_in_turn(tmp_path: Path) -> None:
    ahead, in_turn = records(tmp_path, "2"), records(tmp_path, "0")
    assert sorted(ahead) == sorted(in_turn) and len(ahead) == 6
    isolated = {k for k, r in in_turn.items() if r["case"] != "plain"}
    assert len(isolated) == 4
    for key, rec in in_turn.items():
        other = ahead[key]
        assert (other["outcome"], other["expected"]) == (rec["outcome"], rec["expected"]), key
        # the messages are the same, diagnosis included (stacks name the same frames)
        assert other["message"].splitlines()[0] == rec["message"].splitlines()[0], key
        assert [r.get("state") for r in other["ranks"]] == [
            r.get("state") for r in rec["ranks"]], key
        assert "ran_ahead" not in rec
        assert other.get("ran_ahead", False) is (key in isolated), key
    assert {r["outcome"] for r in ahead.values()} == {"passed", "hang"}


# Declared, with a deadline far past any test: it ends only when the session kills it.
LONG_HANG = """
  - name: long_declared_hang
    world_size: 2
    hangs: true
    deadline: 300
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {}
"""

HANG_AHEAD = """
cases:
  - name: first
    op: all_reduce
    world_size: 2
    shape: [2]
    input: "rank"
    expected: 99
""" + LONG_HANG


def test_a_stopped_session_leaves_no_run_ahead_behind(tmp_path: Path) -> None:
    """-x stops the session at the first case; the declared hang started ahead at once (its
    deadline is 300 s) must die with the session, and it gets no record of a run."""
    marker = f"marker-{uuid.uuid4().hex}"
    (tmp_path / "c.yaml").write_text(textwrap.dedent(HANG_AHEAD))
    proc = start(tmp_path, pytest_argv("c.yaml", "-q", "-x", "-p", "no:randomly",
                                       "--report-json", "r.json"),
                 COLLECTIVE_TEST_MARKER=marker)
    res = finish(proc, HANG_S)
    assert res.returncode == 1, res.stdout
    wait_for(lambda: not rank_pids(marker), HANG_S, "the ranks run ahead to exit")
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["case"] for r in report["records"]] == ["first"]
    assert report["session"]["complete"] is False


STUCK_FIRST = """
cases:
  - name: stuck
    world_size: 2
    deadline: 300
    tensors: {t: {shape: [2], init: zeros}}
    steps:
      - {op: recv, tensor: t, ranks: [1]}  # from any rank: not matched at collection
      - {op: recv, tensor: t, ranks: [0]}
    expected: {t: 0}
""" + LONG_HANG


def test_ctrl_c_while_a_run_ahead_waits_kills_every_rank(tmp_path: Path) -> None:
    """The first case blocks in the main pool while the declared hang waits ahead on its own
    pool: Ctrl-C ends both."""
    marker = f"marker-{uuid.uuid4().hex}"
    (tmp_path / "c.yaml").write_text(textwrap.dedent(STUCK_FIRST))
    proc = start(tmp_path, pytest_argv("c.yaml", "-q", "-p", "no:randomly", "--no-report"),
                 merge_stderr=True, COLLECTIVE_TEST_MARKER=marker)
    try:
        wait_for(lambda: len(rank_pids(marker)) == 4, HANG_S, "both pools' ranks to start")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=HANG_S)
        wait_for(lambda: not rank_pids(marker), HANG_S, "every rank to exit after Ctrl-C")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


# -- at most one pool per thread is held by runs ahead ----------------------------------------

class _Pool:
    def __init__(self, alive: list[int], most: list[int]) -> None:
        self.alive, self.most = alive, most
        alive[0] += 1
        most[0] = max(most[0], alive[0])

    def kill(self) -> None:
        self.alive[0] -= 1


class _Runner:
    """Launches at once; each run leaves a pool alive until it is killed."""

    def __init__(self) -> None:
        self.alive, self.most = [0], [0]
        self.launched: list[str] = []
        self.hung: set[str] = set()  # instances whose need hung twice (Runner.hung_need)

    def hung_need(self, inst: str) -> str:
        return "blocked: op x hung in a and b" if inst in self.hung else ""

    def launch(self, prepared: Any, on_wait: Any = None, started: Any = None) -> Any:
        from harness.runner.execute import Launched

        self.launched.append(prepared.instance)
        return Launched(_Pool(self.alive, self.most), None, 0.0, 0.0)  # type: ignore[arg-type]


class _Prepared:
    def __init__(self, name: str) -> None:
        self.instance = name


def test_runs_ahead_hold_at_most_one_pool_per_thread_when_memory_is_short() -> None:
    from harness.plugin.ahead import Ahead

    runner = _Runner()
    ahead = Ahead(runner, 2, memory_floor=2.0)  # type: ignore[arg-type]  # never enough
    try:
        for n in range(6):
            ahead.submit(f"n{n}", _Prepared(f"i{n}"))  # type: ignore[arg-type]
        wait_for(lambda: len(runner.launched) >= 2, HANG_S, "two runs ahead")
        for n in range(6):
            got = ahead.take(f"n{n}", f"i{n}", lambda _: None)  # type: ignore[arg-type]
            assert got is not None and not isinstance(got, Exception)
            got.pool.kill()  # the item's settle closes its pool
        assert runner.launched == [f"i{n}" for n in range(6)]
        assert runner.most[0] <= 2, f"{runner.most[0]} pools held at once by 2 threads"
    finally:
        ahead.close()


def test_a_run_whose_item_never_came_frees_its_slot() -> None:
    from harness.plugin.ahead import Ahead

    runner = _Runner()
    # Memory short: one slot only, else n1's run starts beside n0's before n2 is taken.
    ahead = Ahead(runner, 1, memory_floor=2.0)  # type: ignore[arg-type]
    try:
        for n in range(3):
            ahead.submit(f"n{n}", _Prepared(f"i{n}"))  # type: ignore[arg-type]
        wait_for(lambda: len(runner.launched) == 1, HANG_S, "the first run ahead")
        # n0's item never takes its run (it failed in the harness): taking n2's run drops
        # n0's (its pool killed, its slot freed) and n1's, instead of waiting forever.
        got = ahead.take("n2", "i2", lambda _: None)  # type: ignore[arg-type]
        assert got is not None and not isinstance(got, Exception)
        got.pool.kill()
        assert runner.launched == ["i0", "i2"] and runner.alive[0] == 0
    finally:
        ahead.close()


def test_a_run_ahead_whose_need_hung_since_it_was_submitted_starts_no_pool() -> None:
    # BabyGloo's subgroup instances, submitted at the session's start, each started a group
    # of worker interpreters and hung to the deadline after the breaker had tripped on
    # subgroups, while their items were skipped as blocked.
    from harness.plugin.ahead import Ahead

    runner = _Runner()
    ahead = Ahead(runner, 1, memory_floor=2.0)  # type: ignore[arg-type]  # one slot
    try:
        for n in range(3):
            ahead.submit(f"n{n}", _Prepared(f"i{n}"))  # type: ignore[arg-type]
        wait_for(lambda: len(runner.launched) == 1, HANG_S, "the first run ahead")
        runner.hung.add("i1")  # the breaker trips while i1 waits for the slot
        got = ahead.take("n0", "i0", lambda _: None)  # type: ignore[arg-type]
        assert got is not None and not isinstance(got, Exception)
        got.pool.kill()
        # No run for n1: its item prepares again (and is skipped as blocked).
        assert ahead.take("n1", "i1", lambda _: None) is None  # type: ignore[arg-type]
        got = ahead.take("n2", "i2", lambda _: None)  # type: ignore[arg-type]
        assert got is not None and not isinstance(got, Exception)
        got.pool.kill()
        assert runner.launched == ["i0", "i2"] and runner.alive[0] == 0
    finally:
        ahead.close()


def test_the_runner_says_a_need_hung_twice_only_with_the_breaker_on() -> None:
    # What a run ahead asks before it starts a pool: the session's own hang breaker.
    from harness.model import InstanceResult, RankState
    from harness.runner.execute import Runner
    from harness.runner.settings import RunSettings
    from tests.helpers import case_instances

    a, b, c = case_instances("""
cases:
  - {name: a, op: all_reduce, world_size: 2, input: "rank", shape: [2]}
  - {name: b, op: all_reduce, world_size: 2, input: "rank", shape: [3]}
  - {name: c, op: broadcast, world_size: 2, input: "rank", shape: [2], args: {src: 0}}
""")
    hung = InstanceResult("hang", "", states=[RankState(0, "blocked", step=0)])
    skip = Runner(RunSettings(after_hang="skip"), caps=object())  # type: ignore[arg-type]
    assert skip.breaker is not None
    skip.breaker.observe(a, hung)
    assert skip.hung_need(b) == ""  # one case is not enough
    skip.breaker.observe(b, hung)
    assert skip.hung_need(a).startswith("blocked: op all_reduce hung in ")
    assert skip.hung_need(c) == ""  # another op still runs
    assert Runner(RunSettings(), caps=object()).hung_need(a) == ""  # type: ignore[arg-type]


def test_runs_ahead_hold_more_pools_than_threads_while_memory_allows() -> None:
    # Isolated instances wait for their items until late in a session: bounded by threads
    # alone, two finished runs took both slots and the rest of the quick suite's isolated
    # instances ran in turn.
    from harness.plugin.ahead import Ahead

    runner = _Runner()
    ahead = Ahead(runner, 2, memory_floor=0.0)  # type: ignore[arg-type]  # always enough
    try:
        for n in range(6):
            ahead.submit(f"n{n}", _Prepared(f"i{n}"))  # type: ignore[arg-type]
        wait_for(lambda: len(runner.launched) == 6, 120, "six runs ahead, none taken")
        assert runner.most[0] == 6
        for n in range(6):
            got = ahead.take(f"n{n}", f"i{n}", lambda _: None)  # type: ignore[arg-type]
            assert got is not None and not isinstance(got, Exception)
            got.pool.kill()
        assert runner.alive[0] == 0
    finally:
        ahead.close()


def test_available_memory_is_a_share_of_the_machine() -> None:
    from harness.plugin.ahead import available_memory

    assert 0.0 < available_memory() <= 1.0
