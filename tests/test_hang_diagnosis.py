"""What a hang's verdict says about where each rank was and what it printed.

``tests/stuck_group.py`` makes ``new_group`` never form a subgroup, the way a third-party
backend did (torchft's wrappers): the ranks hang while the harness makes the case's
``group:``, and the only account of why is an exception a backend thread printed. The verdict
must name that phase (not "building buffers") and quote each hung rank's output, bounded and
escaped, in the message and in the record.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.model import InstanceResult
from harness.report.records import instance_record
from harness.run import ranklog
from harness.runner.execute import Runner
from harness.runner.settings import RunSettings

from .helpers import case_instances

STUCK = """
cases:
  - name: stuck
    op: all_reduce
    world_size: 2
    deadline: 3
    args: {group: [[1]]}
    shape: [2]
    input: "rank"
"""


def run_stuck(noise: int = 0) -> tuple[InstanceResult, dict[str, Any]]:
    (inst,) = case_instances(STUCK)
    # The session's environment (as collective-fuzz --env sets it) reaches every rank.
    runner = Runner(RunSettings(backend_modules=("tests.stuck_group",), deadline_s=3,
                                env=(("STUCK_GROUP", "1"), ("STUCK_GROUP_NOISE", str(noise)))))
    try:
        result = runner.execute(runner.prepare(inst)).result
    finally:
        runner.close()
    return result, instance_record(inst, result, inst.key)


@pytest.fixture(scope="module")
def stuck() -> tuple[InstanceResult, dict[str, Any]]:
    return run_stuck()


def test_a_hang_while_making_the_cases_group_names_the_group(
        stuck: tuple[InstanceResult, dict[str, Any]]) -> None:
    result, record = stuck
    assert result.outcome == "hang", result.message
    assert "rank 1: BLOCKED while building group [1] (new_group)" in result.message
    assert "building buffers" not in result.message
    assert record["ranks"][1]["step_desc"] == "building group [1] (new_group)"


def test_a_hang_quotes_what_each_blocked_rank_printed_escaped(
        stuck: tuple[InstanceResult, dict[str, Any]]) -> None:
    result, record = stuck
    tail = record["ranks"][1]["stderr_tail"]
    assert "KeyError: 'fut-17'" in tail
    assert "future-handler" in tail  # the thread it happened in
    assert "\x1b" not in tail and "\\x1b[31mred\\x1b[0m" in tail
    assert "y" * ranklog.LINE_CHARS + "... (700 more characters)" in tail
    assert "last output (stdout and stderr, escaped):" in result.message
    assert "KeyError: 'fut-17'" in result.message
    assert "\x1b" not in result.message


def test_the_quoted_output_is_bounded_whatever_the_rank_printed() -> None:
    result, record = run_stuck(noise=5000)
    tail = record["ranks"][1]["stderr_tail"]
    lines = tail.splitlines()
    assert len(lines) <= ranklog.TAIL_LINES
    assert all(len(ln) <= ranklog.LINE_CHARS + 40 for ln in lines)
    assert "KeyError: 'fut-17'" in tail and "noise 4999" in tail
    assert "noise 0\n" not in tail
    assert len(result.message) < 20_000


def test_a_tail_marks_the_output_of_earlier_instances(tmp_path: Any) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("old line\n")
    since = log.stat().st_size
    with log.open("a") as fh:
        fh.write("new line\n")
    assert ranklog.tail(str(log), since) == f"old line\n{ranklog.EARLIER}\nnew line"
    # Nothing printed during the instance: the last lines, said to be earlier ones.
    assert ranklog.tail(str(log), log.stat().st_size) == f"old line\nnew line\n{ranklog.EARLIER}"


RAISE_VS_STUCK = """
cases:
  - name: raise_vs_stuck
    world_size: 2
    deadline: 3
    raises: "boom"
    steps:
      - {raise: "boom", ranks: [0]}
      - {new_group: g, members: [1], ranks: [1], use_local_synchronization: true}
    expected: {}
"""


def test_a_rank_blocked_where_it_should_have_raised_has_its_last_output_quoted() -> None:
    (inst,) = case_instances(RAISE_VS_STUCK)
    runner = Runner(RunSettings(backend_modules=("tests.stuck_group",), deadline_s=3,
                                env=(("STUCK_GROUP", "1"),)))
    try:
        result = runner.execute(runner.prepare(inst)).result
    finally:
        runner.close()
    assert result.outcome == "hang", result.message
    assert "rank 1 blocked in step 1 (new_group('g'))  <- expected to raise" in result.message
    assert "rank 1 last output (stdout and stderr, escaped):" in result.message
    assert "KeyError: 'fut-17'" in result.message



CROSSED = """
cases:
  - name: crossed
    world_size: 3
    deadline: 3
    tensors: {t: {shape: [2], init: rank}, u: {shape: [2], init: poison}}
    steps:
      - {op: all_reduce, tensor: t, ranks: [2], group: [2]}
      - {op: recv, tensor: u, src: "1 - rank", ranks: [0, 1]}
      - {op: send, tensor: t, dst: "1 - rank", ranks: [0, 1]}
    expected: {u: {0: 1, 1: 0, 2: unchanged}}
"""


def test_a_hang_in_a_recv_names_the_step_and_the_peer() -> None:
    """Issue 43.6: sends and receives that match in number but not in order (each rank
    receives first) pass the collection check and hang; the message points at the step's
    line and says whom each blocked rank waits for and what that peer was doing."""
    (inst,) = case_instances(CROSSED)
    runner = Runner(RunSettings(deadline_s=3))
    try:
        result = runner.execute(runner.prepare(inst)).result
    finally:
        runner.close()
    assert result.outcome == "hang", result.message
    first = result.message.splitlines()[0]
    assert first.startswith("cases/x.yaml:9: crossed[gloo-ws3-float32-sum-sync]: no result "
                            "after the 3 s deadline; rank(s) [0, 1] blocked; rank 0 waits (line 9) "
                            "to receive from rank 1, which is blocked in step 1 "
                            "(recv(tensor=u))"), first
    assert ("rank 1: BLOCKED in step 1 (recv(tensor=u)); waits (line 9) to receive from "
            "rank 0, which is blocked in step 1") in result.message
    assert "rank 2: finished" in result.message
