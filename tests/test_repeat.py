"""``repeat``/``slices`` on op steps: validation and expansion (cases/stress.yaml runs them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors
from harness.expr import Expr
from harness.model import Instance

PROGRAM = """
cases:
  - name: p
    world_size: 2
    tensors:
      t: {{shape: [4, 3], init: 0}}
    steps:
      - {step}
    expected: {{t: 0}}
"""


def instances(step: str) -> list[Instance]:
    doc = yamlload.load_text(textwrap.dedent(PROGRAM.format(step=step)), "cases/x.yaml")
    out: list[Instance] = []
    for case in validate.load_cases(doc):
        out.extend(expand.expand(case, "gloo"))
    return out


def test_repeat_and_slices_reach_the_step() -> None:
    (inst,) = instances("{op: broadcast, tensor: t, src: 'rep % world_size', repeat: 4, "
                        "slices: true}")
    step = inst.steps[0]
    assert step.repeat == 4 and step.slices
    src = dict(step.args)["src"]
    assert isinstance(src, Expr) and src({"rep": 3, "world_size": 2, "rank": 0}) == 1


@pytest.mark.parametrize(("step", "message"), [
    ("{op: all_reduce, tensor: t, slices: true}", "'slices' needs 'repeat: N'"),
    ("{sleep: 0.1, repeat: 2}", "'repeat' belongs to op steps"),
    ("{op: all_reduce, tensor: t, repeat: 3, slices: true}",
     "tensor t has 4 slice(s) along dim 0 but the step repeats 3 time(s)"),
    ("{op: broadcast, tensor: t, src: 'rep'}", "unknown name 'rep'"),
    ("{op: all_reduce, tensor: t, repeat: 0}", "0 is less than the minimum of 1"),
])
def test_bad_repeat_is_reported_at_its_line(step: str, message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(step)
    assert message in str(info.value) and "cases/x.yaml:8" in str(info.value)


def test_wait_timeout_reaches_the_step() -> None:
    text = textwrap.dedent("""
    cases:
      - name: p
        world_size: 2
        tensors:
          t: {shape: [2], init: 0}
        steps:
          - {op: all_reduce, tensor: t, async: true, handle: h}
          - {wait: h, timeout: 1.5}
        expected: {t: 0}
    """)
    doc = yamlload.load_text(text, "cases/x.yaml")
    (case,) = validate.load_cases(doc)
    (inst,) = expand.expand(case, "gloo")
    assert dict(inst.steps[1].args) == {"timeout": 1.5}


STRESS_LIST = """
cases:
  - name: separate_tensors
    description: upstream's coalesced stress tests, pg.allreduce(inputs[i]) for each i
    world_size: 2
    tensors:
      t0: {shape: [3], init: "rank + i"}
      t1: {shape: [3], init: "10 * rank + i"}
      t2: {shape: [2], init: "100 + rank"}
    steps:
      - {op: all_reduce, tensor: [t0, t1, t2], repeat: 3, slices: true, async: true,
         handle: h}
      - {wait: h}
    expected:
      t0: "2 * i + 1"
      t1: "2 * i + 10"
      t2: %s
"""


def test_slices_accept_one_named_tensor_per_repetition(tmp_path: Path) -> None:
    """Issue 22, point 10: the list form runs and is checked tensor by tensor on Gloo."""
    from .helpers import load_report, run_pytest, write_case_file

    write_case_file(tmp_path, STRESS_LIST % '"201"')
    res = run_pytest(tmp_path, "c.yaml", "-q", "--rootdir", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    (rec,) = load_report(tmp_path / "reports" / "conformance.json")["records"]
    assert rec["outcome"] == "passed"
    assert {c["tensor"] for c in rec["ranks"][0]["checks"]} >= {"t0", "t1", "t2"}
    # A wrong value in the last repetition's tensor fails, and names that tensor.
    write_case_file(tmp_path, STRESS_LIST % '"200"')
    res = run_pytest(tmp_path, "c.yaml", "-q", "--rootdir", str(tmp_path))
    assert res.returncode == 1
    (rec,) = load_report(tmp_path / "reports" / "conformance.json")["records"]
    assert rec["outcome"] == "failed" and "buffer 't2'" in rec["message"]


@pytest.mark.parametrize(("step", "message"), [
    ("{op: all_reduce, tensor: [t, u], repeat: 3, slices: true}",
     "the step repeats 3 time(s) but lists 2 tensor(s)"),
    ("{op: all_reduce, tensor: [t, nope], repeat: 2, slices: true}", "unknown tensor 'nope'"),
    ("{op: all_reduce_coalesced, tensors: [t, t], repeat: 2, slices: true}",
     "tensor t has 4 slice(s) along dim 0 but the step repeats 2 time(s)"),
])
def test_bad_per_repetition_lists_are_reported(step: str, message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(step)
    assert message in str(info.value)


COALESCED_STRESS = """
cases:
  - name: coalesced_separate_tensors
    description: >-
      upstream's coalesced stress tests: pg.allreduce_coalesced(inputs[i]) with inputs[i] a
      list of two tensors, all calls in flight
    world_size: [2, 3]
    dtype: int64
    tensors:
      a: {shape: [40, 1], init: "i + rank"}
      b: {shape: [40, 3], init: "10 * j + k + rank"}
    steps:
      - {op: all_reduce_coalesced, tensors: [a, b], repeat: 40, slices: true, async: true,
         handle: h}
      - {wait: h}
    expected:
      a: "world_size * i + world_size * (world_size - 1) / 2"
      b: %s
"""


def test_slices_of_a_list_buffer_of_named_tensors_run_on_gloo(tmp_path: Path) -> None:
    """Issue 22, point 10: ``tensors: [a, b]`` with slices was refused ("'slices' needs one
    tensor per buffer"); repetition rep now passes [a[rep], b[rep]], checked per tensor."""
    from .helpers import load_report, run_pytest, write_case_file

    right = '"world_size * (10 * j + k) + world_size * (world_size - 1) / 2"'
    write_case_file(tmp_path, COALESCED_STRESS % right)
    res = run_pytest(tmp_path, "c.yaml", "-q", "--rootdir", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    recs = load_report(tmp_path / "reports" / "conformance.json")["records"]
    assert [r["outcome"] for r in recs] == ["passed", "passed"]
    assert {c["tensor"] for c in recs[0]["ranks"][0]["checks"]} >= {"a", "b"}
    # One element off in the second tensor of the list: the instance fails and names it.
    wrong = right[:-1] + ' + (1 if i == 61 else 0)"'
    write_case_file(tmp_path, COALESCED_STRESS % wrong)
    res = run_pytest(tmp_path, "c.yaml", "-q", "--rootdir", str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    recs = load_report(tmp_path / "reports" / "conformance.json")["records"]
    assert [r["outcome"] for r in recs] == ["failed", "failed"]
    assert all("buffer 'b'" in r["message"] for r in recs), recs[0]["message"]


def test_each_sliced_list_entry_must_have_one_slice_per_repetition() -> None:
    text = textwrap.dedent("""
    cases:
      - name: p
        world_size: 2
        tensors:
          a: {shape: [3, 2], init: 0}
          o: {shape: [3], dtype: object, init: 0}
          c: {shape: [2, 2], init: 0}
        steps:
          - {op: all_reduce_coalesced, tensors: [a, c, o], repeat: 3, slices: true}
    """)
    with pytest.raises(CaseFileErrors) as info:
        validate.load_cases(yamlload.load_text(text, "cases/x.yaml"))
    msg = str(info.value)
    assert ("cases/x.yaml:10:49: at cases[0].steps[0].tensors[1]: tensor c has 2 slice(s) "
            "along dim 0 but the step repeats 3 time(s)") in msg, msg
    # an object entry is named once, by the list checks
    assert msg.startswith("2 problem(s)") and "'o' is an object buffer" in msg, msg
    (inst,) = instances("{op: all_reduce_coalesced, tensors: [t, t], repeat: 4, slices: true}")
    assert inst.steps[0].slices and inst.steps[0].repeat == 4
