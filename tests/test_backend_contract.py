"""The API-contract keys and steps of PyTorch's backend contract suites: ``call_returns``,
``raises: {type: ...}``, ``drop``, ``seq_number``, ``work_registry``, ``enable_timing``, the
Work keys of ``work_state`` and the CUDA device steps. Errors at file:line:col, expansion,
and a Gloo run in which each wrong claim fails and each right one passes."""

from __future__ import annotations

import textwrap

import pytest

from harness.errors import CaseFileError, CaseFileErrors
from tests.helpers import case_instances as instances
from tests.helpers import load_report

pytest_plugins = ["pytester"]

PROGRAM = """
cases:
  - name: p
    world_size: 2
    tensors:
      t: {{shape: [2], init: 1}}
    steps:
      - {{op: all_reduce, tensor: t, async: true, handle: h}}
      - {{wait: h}}
      - {step}
    expected: {{t: 2}}
"""


@pytest.mark.parametrize(("step", "line", "message"), [
    ("{drop: nope}", 10, "no earlier step has handle 'nope'"),
    ("{op: barrier, call_returns: none, repeat: 2}", 10, "it cannot be repeated"),
    ("{op: barrier, call_returns: none, raises: x}", 10, "a call that must raise returns nothing"),
    ("{op: barrier, call_returns: maybe}", 10, "'maybe' is not allowed"),
    ("{op: barrier, raises: {type: 'Not a class'}}", 10, "is not an exception class name"),
    ("{current_device: 0}", 10, "a current_device step needs CUDA tensors"),
    ("{seq_number: 'rank +'}", 10, "bad expression"),
    ("{work_state: h, duration: {raises: '[x'}}", 10, "bad regular expression '[x'"),
    ("{work_state: h, future_result: done}", 10, "future_result"),
    ("{wait: h, sequence_number: 1}", 10, "'sequence_number' belongs to work_state steps"),
])
def test_bad_contract_steps_are_reported_at_their_line(step: str, line: int,
                                                       message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(PROGRAM.format(step=step))
    text = str(info.value)
    assert f"cases/x.yaml:{line}:" in text and message in text, text


def test_call_returns_on_a_program_case_is_an_error() -> None:
    text = PROGRAM.format(step="{op: barrier}").replace(
        "    world_size: 2\n", "    world_size: 2\n    call_returns: auto\n")
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(text)
    assert "cases/x.yaml:5:" in str(info.value) and "belongs to the 'op:' form" in str(info.value)


def test_expansion_resolves_auto_and_isolates_stateful_programs() -> None:
    shorthand = """
cases:
  - name: s
    op: broadcast
    world_size: 2
    async: [false, true]
    args: {src: 0}
    call_returns: auto
    shape: [2]
    input: rank
"""
    sync, asy = instances(shorthand)
    assert (sync.steps[0].call_returns, asy.steps[0].call_returns) == ("none", "work")
    (dropped,) = instances(PROGRAM.format(step="{op: barrier}").replace("{wait: h}", "{drop: h}"))
    assert dropped.isolate and dropped.steps[1].kind == "drop" and dropped.steps[1].waits == ("h",)
    (typed,) = instances(PROGRAM.format(
        step="{op: barrier, raises: {type: [RuntimeError, ValueError]}}"))
    assert typed.steps[2].raises == "" and typed.steps[2].raises_types == ("RuntimeError",
                                                                          "ValueError")
    (plain,) = instances(PROGRAM.format(step="{work_registry: 0}"))
    assert not plain.isolate and plain.steps[2].value == 0


CASES = """
defaults:
  world_size: 2
cases:
  - name: returns_right
    op: all_reduce
    async: [false, true]
    call_returns: auto
    shape: [2]
    input: rank
  - name: returns_wrong
    op: all_reduce
    call_returns: work
    shape: [2]
    input: rank
  - name: type_right
    tensors:
      a: {shape: [4], init: 1}
      b: {shape: [8], dtype: float64, init: poison}
    steps:
      - {op: all_gather_single, input: a, output: b, raises: {type: [ValueError, RuntimeError]}}
    expected: {a: 1}
  - name: type_wrong
    tensors:
      a: {shape: [4], init: 1}
      b: {shape: [8], dtype: float64, init: poison}
    steps:
      - {op: all_gather_single, input: a, output: b, raises: {type: TypeError}}
    expected: {a: 1}
  - name: seq_right
    tensors:
      t: {shape: [1], init: 1}
    steps:
      - {seq_number: 0}
      - {op: all_reduce, tensor: t}
      - {seq_number: 1}
    expected: {t: 2}
  - name: seq_wrong
    tensors:
      t: {shape: [1], init: 1}
    steps:
      - {op: all_reduce, tensor: t}
      - {seq_number: 2}
    expected: {t: 2}
  - name: registry_wrong
    tensors:
      t: {shape: [1], init: 1}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h, register_work: true}
      - {work_registry: 0}
      - {wait: h, register_work: true}
    expected: {t: 2}
  - name: dropped_work_completes
    tensors:
      t: {shape: [4], init: "rank + 1"}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {drop: h}
      - {op: barrier}
    expected: {t: 3}
  - name: duration_claimed_on_gloo
    tensors:
      t: {shape: [4], init: 1}
    steps:
      - {enable_timing: true}
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {wait: h}
      - {work_state: h, duration: positive}
    expected: {t: 2}
"""


def test_gloo_run_fails_each_wrong_claim(pytester: pytest.Pytester) -> None:
    (pytester.path / "c.yaml").write_text(textwrap.dedent(CASES))
    pytester.runpytest("c.yaml", "-q", "-p", "no:randomly")
    report = load_report(pytester.path / "reports" / "conformance.json")
    outcome: dict[str, list[str]] = {}
    msg: dict[str, str] = {}
    for r in report["records"]:
        outcome.setdefault(r["case"], []).append(r["outcome"])
        msg[r["case"]] = r["message"]
    for good in ("returns_right", "type_right", "seq_right", "dropped_work_completes"):
        assert set(outcome[good]) == {"passed"}, (good, msg[good])
    for bad in ("returns_wrong", "type_wrong", "seq_wrong", "registry_wrong",
                "duration_claimed_on_gloo"):
        assert outcome[bad] == ["failed"], (bad, msg[bad])
    assert "expected a torch.distributed.Work got None" in msg["returns_wrong"]
    assert "RuntimeError is none of TypeError" in msg["type_wrong"]
    assert "seq_number of step 1" in msg["seq_wrong"] and "expected 2 got 1" in msg["seq_wrong"]
    assert "expected 0 got 1" in msg["registry_wrong"]
    assert "support getDuration" in msg["duration_claimed_on_gloo"]
    # A pass lists what was compared: the return of the call is evidence of its own.
    rec = next(r for r in report["records"] if r["case"] == "returns_right")
    assert any("return of the call" in c["what"] for c in rec["evidence"]["checks"])
