"""``raises:`` on waits with the ``work_state`` step: validation at file:line:col, expansion,
the rank-side checks, and a real Gloo run where a failed Work must report its error."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from harness.errors import CaseFileError, CaseFileErrors
from harness.model import Step
from harness.program import stepchecks
from tests.helpers import case_instances as instances
from tests.helpers import load_report

pytest_plugins = ["pytester"]


PROGRAM = """
cases:
  - name: p
    world_size: 2
    tensors:
      t: {{shape: [2], init: 0}}
    steps:
      - {{op: all_reduce, tensor: t, async: true, handle: h}}
      - {{op: all_reduce, tensor: t, async: true, handle: g}}
      - {step}
    expected: {{t: 0}}
"""


def program(step: str) -> str:
    return PROGRAM.format(step=step)


def test_raises_and_work_state_reach_the_steps() -> None:
    text = PROGRAM.format(step="{wait: h, raises: 'Timed out', timeout: 2}\n"
                          "      - {work_state: h, is_success: false, exception: 'Timed out', "
                          "ranks: [0]}")
    (inst,) = instances(text)
    wait, state = inst.steps[2], inst.steps[3]
    assert dict(wait.args) == {"timeout": 2.0} and wait.raises == "Timed out"
    assert state.kind == "work_state" and state.waits == ("h",) and state.ranks == (0,)
    assert state.args == (("is_success", False), ("exception", "Timed out"))
    assert state.describe() == "work_state(h)"
    assert inst.isolate  # a failed op may poison the group: never reuse the pool
    (plain,) = instances(program("{wait: h}"))
    assert not plain.isolate


@pytest.mark.parametrize(("step", "where", "message"), [
    ("{work_state: nope, is_success: true}", "10:22", "no earlier step has handle 'nope'"),
    ("{work_state: h}", "10:9", "a work_state step states at least one of: is_completed"),
    ("{work_state: h, exception: '[x'}", "10:36", "bad regular expression '[x'"),
    ("{wait: h, is_success: true}", "10:31", "'is_success' belongs to work_state steps"),
    ("{work_state: h, is_completed: maybe}", "10:39", "'maybe' is not of type boolean"),
])
def test_bad_work_state_steps_are_reported_at_their_position(step: str, where: str,
                                                             message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(program(step))
    text = str(info.value)
    assert f"cases/x.yaml:{where}:" in text and message in text, text


class FakeWork:
    def __init__(self, completed: bool, success: bool, exc: BaseException | None) -> None:
        self.completed, self.success, self.exc = completed, success, exc

    def is_completed(self) -> bool:
        return self.completed

    def is_success(self) -> bool:
        return self.success

    def exception(self) -> Any:
        return self.exc


def state_step(**stated: Any) -> Step:
    return Step("work_state", 1, waits=("h",), args=tuple(stated.items()))


def test_work_state_compares_every_stated_property() -> None:
    failed = FakeWork(True, False, RuntimeError("Timed out waiting 1000ms"))
    step = state_step(is_completed=True, is_success=False, exception="RuntimeError: Timed out")
    good = stepchecks.check_work_state(3, step, failed)
    assert good.ok and good.total == 3 and good.tensor == "work_state of step 3 (h)"
    bad = stepchecks.check_work_state(3, step, FakeWork(True, True, None))
    assert not bad.ok and bad.wrong == 2
    assert bad.first_wrong == [(1, "is_success: False", "True"),
                               (2, "exception: 'RuntimeError: Timed out'", "None")]
    none = stepchecks.check_work_state(0, state_step(exception="none"), failed)
    assert not none.ok and "Timed out waiting" in none.first_wrong[0][2]
    # A truthy non-bool is not True: the API's type is part of what is checked.
    odd = stepchecks.check_work_state(0, state_step(is_completed=True), FakeWork(1, 1, None))  # type: ignore[arg-type]
    assert not odd.ok


def test_a_missing_method_or_work_is_a_failed_check_not_a_crash() -> None:
    class NoSuccess:
        def is_completed(self) -> bool:
            return True

    got = stepchecks.check_work_state(0, state_step(is_completed=True, is_success=False),
                                      NoSuccess())
    assert not got.ok and got.wrong == 1 and "is_success() raised AttributeError" in \
        got.first_wrong[0][2]
    missing = stepchecks.check_work_state(0, state_step(is_success=False), None)
    assert not missing.ok and "no Work named 'h' on this rank" in missing.first_wrong[0][2]


CASES = """
cases:
  - name: failed_work
    world_size: 2
    pg_timeout: 1
    deadline: 20
    tensors:
      t: {shape: [4], init: 1}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h, ranks: [0]}
      - {wait: h, raises: "Timed out", ranks: [0]}
      - {work_state: h, is_completed: true, is_success: false, exception: "Timed out",
         ranks: [0]}
    expected:
      t: {0: unspecified, others: unchanged}
  - name: claims_success
    world_size: 2
    pg_timeout: 1
    deadline: 20
    tensors:
      t: {shape: [4], init: 1}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h, ranks: [0]}
      - {wait: h, raises: "Timed out", ranks: [0]}
      - {work_state: h, is_success: true, exception: none, ranks: [0]}
    expected:
      t: {0: unspecified, others: unchanged}
"""


def test_gloo_failed_work_reports_its_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "ws.yaml").write_text(textwrap.dedent(CASES))
    res = pytester.runpytest("ws.yaml", "-q", "-p", "no:randomly")
    report = load_report(pytester.path / "reports" / "conformance.json")
    by_case = {r["case"]: r for r in report["records"]}
    bad = by_case["claims_success"]
    assert bad["outcome"] == "failed"
    assert "is_success: True got False" in bad["message"]
    unusable = "exception() raised TypeError: Unable to convert function return value"
    if unusable in by_case["failed_work"]["message"]:
        # torch 2.4.1's Work.exception() cannot be called from Python (pybind cannot convert
        # its exception_ptr): the check names that, and only that, as wrong.
        res.assert_outcomes(failed=2)
        failed = by_case["failed_work"]["message"]
        assert "1 of 3 element(s) wrong" in failed and "[2] expected exception:" in failed
        assert unusable in bad["message"]
    else:
        res.assert_outcomes(passed=1, failed=1)
        assert by_case["failed_work"]["outcome"] == "passed"
        assert "exception: 'none' got RuntimeError" in bad["message"]
