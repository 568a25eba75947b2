"""``repeat``/``slices`` on op steps: validation and expansion (cases/stress.yaml runs them)."""

from __future__ import annotations

import textwrap

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
    """)
    doc = yamlload.load_text(text, "cases/x.yaml")
    (case,) = validate.load_cases(doc)
    (inst,) = expand.expand(case, "gloo")
    assert dict(inst.steps[1].args) == {"timeout": 1.5}
