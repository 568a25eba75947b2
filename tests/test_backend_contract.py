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
  - name: future_result_right
    tensors:
      t: {shape: [4], init: 1}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {wait: h}
      - {work_state: h, future_result: {raises: "getFutureResult not implemented"}}
    expected: {t: 2}
  - name: future_result_claimed_on_gloo
    tensors:
      t: {shape: [4], init: 1}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {wait: h}
      - {work_state: h, future_result: success}
    expected: {t: 2}
  - name: future_result_other_error_claimed
    tensors:
      t: {shape: [4], init: 1}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {wait: h}
      - {work_state: h, future_result: {raises: "TimeoutError"}}
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
    for good in ("returns_right", "type_right", "seq_right", "dropped_work_completes",
                 "future_result_right"):
        assert set(outcome[good]) == {"passed"}, (good, msg[good])
    for bad in ("returns_wrong", "type_wrong", "seq_wrong", "registry_wrong",
                "duration_claimed_on_gloo", "future_result_claimed_on_gloo",
                "future_result_other_error_claimed"):
        assert outcome[bad] == ["failed"], (bad, msg[bad])
    assert "expected a torch.distributed.Work got None" in msg["returns_wrong"]
    assert "RuntimeError is none of TypeError" in msg["type_wrong"]
    assert "seq_number of step 1" in msg["seq_wrong"] and "expected 2 got 1" in msg["seq_wrong"]
    assert "expected 0 got 1" in msg["registry_wrong"]
    assert "support getDuration" in msg["duration_claimed_on_gloo"]
    # A future_result claim Gloo does not meet names the claim and what the call did.
    assert ("[0] expected future_result: 'success' got raised RuntimeError"
            in msg["future_result_claimed_on_gloo"]), msg["future_result_claimed_on_gloo"]
    assert "getFutureResult not implemented" in msg["future_result_claimed_on_gloo"]
    other = msg["future_result_other_error_claimed"]
    assert "expected future_result: {'raises': 'TimeoutError'} got RuntimeError" in other, other
    # A pass lists what was compared: the return of the call is evidence of its own.
    rec = next(r for r in report["records"] if r["case"] == "returns_right")
    assert any("return of the call" in c["what"] for c in rec["evidence"]["checks"])


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """torch.cuda's current device as a plain integer (no GPU here): what set_device made
    current, which a backend under test may change behind the program's back."""
    import torch

    current = [0]
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.__setitem__(0, int(d)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    return current


@pytest.mark.parametrize("backend_device", [None, 0])
def test_a_backend_that_changes_the_current_device_fails_the_bundled_claim(
        fake_cuda: list[int], backend_device: int | None) -> None:
    """cases/backend_contract.yaml::collective_preserves_current_device needs a GPU; on CPU its
    rank-side checks and the verdict run against a faked current device: a backend whose
    collective leaves device 0 current (the nccl2 gap "ranks reusing device 0") fails on the
    rank that had made another device current, with the claim and what was seen; a backend
    that leaves it alone passes."""
    from pathlib import Path

    from harness.model import PoolRun, RankResult
    from harness.program import contract
    from harness.verdict import outcome

    text = (Path(__file__).resolve().parent.parent / "cases" / "backend_contract.yaml").read_text(
        "utf-8")
    (inst,) = [i for i in instances(text, "nccl")
               if i.case == "collective_preserves_current_device"]
    set_dev, op, claim = inst.steps
    assert (set_dev.kind, op.op, claim.kind) == ("set_device", "all_reduce", "current_device")
    results = {}
    for rank in range(inst.world_size):
        env = {"rank": rank, "world_size": inst.world_size}
        assert contract.run(0, set_dev, None, env) is None
        if backend_device is not None:  # what the backend's all_reduce did to the device
            fake_cuda[0] = backend_device
        check = contract.run(2, claim, None, env)
        assert check is not None
        results[rank] = RankResult(rank=rank, status="ok", checks=[check])
    verdict = outcome.judge(inst, PoolRun(kind="done", results=results), 20.0)
    if backend_device is None:
        assert verdict.outcome == "passed", verdict.message
        return
    assert verdict.outcome == "failed"
    assert ("rank 0, buffer 'current_device of step 2' (explicit): 1 of 1 element(s) wrong; "
            "first: [0] expected 1 got 0") in verdict.message, verdict.message
    assert "rank 1" not in verdict.message  # rank 1 had made device 0 current itself
