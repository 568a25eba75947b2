"""The registry of step kinds (harness.casefile.stepkinds): every action has exactly one kind,
the schema and the programs page know every action, validation and building dispatch through
it, and each kind's problems are listed where its ``check_after`` stage says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.casefile import programcheck, stepkinds
from harness.casefile.schema import case_schema
from harness.casefile.stepkinds import base
from harness.model import Step
from tests.helpers import case_error, case_instances

ROOT = Path(__file__).resolve().parents[1]


def test_every_action_has_exactly_one_kind() -> None:
    owners: dict[str, list[str]] = {}
    for kind in stepkinds.KINDS:
        assert isinstance(kind, base.StepKind), kind
        assert kind.actions, type(kind).__name__
        assert kind.check_after in base.STAGES, type(kind).__name__
        for action in kind.actions:
            owners.setdefault(action, []).append(type(kind).__name__)
    assert {a: o for a, o in owners.items() if len(o) != 1} == {}
    assert tuple(owners) == stepkinds.STEP_ACTIONS
    assert set(stepkinds.BY_ACTION) == set(owners)


def test_the_common_checks_have_one_stage_each() -> None:
    assert tuple(stage for stage, _ in programcheck.COMMON_CHECKS) == base.STAGES


def test_the_schema_and_the_programs_page_know_every_action() -> None:
    step_keys = set(case_schema()["$defs"]["step"]["properties"])
    assert [a for a in stepkinds.STEP_ACTIONS if a not in step_keys] == []
    page = (ROOT / "docs" / "reference" / "programs.md").read_text("utf-8")
    assert [a for a in stepkinds.STEP_ACTIONS
            if not re.search(rf"`{a}`|`\{{{a}:", page)] == []
    # The kinds a key belongs to are kinds of the registry.
    assert {a for kinds in programcheck.ONLY_WITH.values() for a in kinds} <= set(
        stepkinds.BY_ACTION)


def test_the_step_error_lists_the_registry_in_order() -> None:
    message = case_error("""
        cases:
          - name: p
            world_size: 2
            steps:
              - {ranks: [0]}
        """)
    assert "a step needs exactly one of: " + ", ".join(stepkinds.STEP_ACTIONS) in message


PROGRAM = """
cases:
  - name: p
    world_size: 2
    device: cuda
    tensors:
      t: {shape: [2], init: 0}
    steps:
      - {op: all_reduce, tensor: t, async: true, handle: h}
      - {new_group: g, members: [0, 1]}
      - {op: all_reduce, tensor: t, group: g, async: true, handle: k}
      - {wait: h}
      - {work_state: h, is_completed: true}
      - {sleep: 0.01}
      - {sync: true}
      - {delay_stream: 0.01}
      - {write: t, value: 1}
      - {read: t, expect: final}
      - {future: k, tensor: t}
      - {wait_tensor: t}
      - {set_timeout: 5}
      - {capture: c, steps: [{op: all_reduce, tensor: t, async: true, handle: q},
                             {wait: q}]}
      - {replay: c}
      - {wait_stream: side}
      - {op: all_reduce, tensor: t, async: true, handle: b}
      - {block_current_stream: b}
      - {destroy: true}
      - {exit: 0, ranks: [1]}
    unchecked:
      t: only the steps it goes through are built here
"""


def test_every_kind_builds_its_own_steps() -> None:
    (inst,) = case_instances(PROGRAM)
    built = [s.kind for s in inst.steps]
    assert built == ["op", "new_group", "op", "wait", "work_state", "sleep", "sync",
                     "delay_stream", "write", "read", "future", "wait_tensor", "set_timeout",
                     "capture", "replay", "wait_stream", "op", "block_current_stream",
                     "destroy", "exit"]
    capture = inst.steps[13]
    assert [s.kind for s in capture.steps] == ["op", "wait"]
    assert capture.steps[0].line == capture.line  # built through the registry, line and all
    assert inst.steps[-1] == Step("exit", inst.steps[-1].line, ranks=(1,), value=0)


# Problems are listed by file position; where a YAML alias puts one value under two keys,
# both problems have its position, and the order they were found in shows.
@pytest.mark.parametrize(("step", "first", "second"), [
    # an ordering step's own problem comes right after the key checks, before ranks'
    ("{write: &a 'nope +', value: 1, ranks: *a}", "unknown tensor 'nope +'", "bad expression"),
    # a work_state step's after raises/returns/warns, before ranks'
    ("{work_state: &a 'nope +', is_completed: true, returns: *a}",
     "'returns' belongs to op steps", "no earlier step has handle 'nope +'"),
    ("{work_state: &a 'nope +', is_completed: true, ranks: *a}",
     "no earlier step has handle 'nope +'", "bad expression"),
    # an op step's and a wait's come last
    ("{op: all_reduce, tensor: &a 'nope +', ranks: *a}", "bad expression",
     "unknown tensor 'nope +'"),
    ("{wait: &a 'nope +', ranks: *a}", "bad expression", "no earlier step has handle 'nope +'"),
])
def test_a_kinds_problems_come_at_its_stage(step: str, first: str, second: str) -> None:
    message = case_error(f"""
        cases:
          - name: p
            world_size: 2
            tensors:
              t: {{shape: [2], init: 0}}
            steps:
              - {step}
        """)
    lines = [ln for ln in message.splitlines() if not ln.startswith(" ")][1:]
    assert len(lines) == 2 and len({ln.split(": at ")[0] for ln in lines}) == 1, message
    assert first in lines[0] and second in lines[1], message
