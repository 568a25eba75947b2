"""``returns:`` on op steps: validation, per-rank expansion and the rank-side check."""

from __future__ import annotations

import pytest

from harness.errors import CaseFileError, CaseFileErrors
from harness.expr import Expr
from harness.program import stepchecks
from tests.helpers import case_instances as instances

PROGRAM = """
cases:
  - name: p
    world_size: 3
    tensors:
      t: {{shape: [2], init: 0}}
    steps:
      - {step}
"""


def program(step: str) -> str:
    return PROGRAM.format(step=step)


def test_returns_expand_per_rank() -> None:
    (inst,) = instances(program("{op: recv, tensor: t, ranks: [0], "
                                "returns: {0: 'world_size - 1', 1: 5, others: unspecified}}"))
    rets = inst.steps[0].returns
    assert rets is not None and isinstance(rets[0], Expr) and rets[1] == 5 and rets[2] is None
    (inst,) = instances(program("{op: recv, tensor: t, returns: 1}"))
    assert inst.steps[0].returns == (1, 1, 1)


@pytest.mark.parametrize(("step", "message"), [
    ("{op: all_reduce, tensor: t, returns: 1}", "op all_reduce returns nothing a case can check"),
    ("{sleep: 0.1, returns: 1}", "'returns' belongs to op steps"),
    ("{op: recv, tensor: t, returns: 'nope + 1'}", "bad expression 'nope + 1'"),
    ("{op: recv, tensor: t, returns: {x: 1}}", "per-rank keys are ranks or 'others'"),
    ("{op: recv, tensor: t, returns: {7: 1}}", "returns names rank 7 but world_size is 3"),
    ("{op: recv, tensor: t, returns: 1.5}", "1.5 does not fit here"),
])
def test_bad_returns_are_reported_at_their_line(step: str, message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(program(step))
    assert message in str(info.value) and "cases/x.yaml:" in str(info.value)


def test_check_return_compares_value_and_type() -> None:
    (inst,) = instances(program("{op: recv, tensor: t, returns: 'rank + 1'}"))
    step = inst.steps[0]
    assert stepchecks.check_return(0, step, 1, 3, {}, {"value": 2}).ok
    bad = stepchecks.check_return(0, step, 1, 3, {}, {"value": 1})
    assert not bad.ok and bad.first_wrong == [(0, "2", "1")]
    assert not stepchecks.check_return(0, step, 1, 3, {}, {"value": 2.0}).ok
    missing = stepchecks.check_return(0, step, 1, 3, {}, {})
    assert not missing.ok and "returned no value" in missing.note


def test_check_warns_matches_type_and_message() -> None:
    (inst,) = instances(program("{op: all_reduce, tensor: t, warns: 'UserWarning: .*group'}"))
    step = inst.steps[0]
    assert step.warns == "UserWarning: .*group"
    ok = stepchecks.check_warns(0, step, {"warnings": ["UserWarning: not in group"]})
    assert ok.ok
    bad = stepchecks.check_warns(0, step, {"warnings": ["FutureWarning: group"]})
    assert not bad.ok and bad.first_wrong[0][2] == "FutureWarning: group"
    assert not stepchecks.check_warns(0, step, {}).ok


@pytest.mark.parametrize(("step", "message"), [
    ("{op: all_reduce, tensor: t, warns: '(('}", "bad regular expression"),
    ("{sleep: 0.1, warns: x}", "'warns' belongs to op steps"),
])
def test_bad_warns_is_reported(step: str, message: str) -> None:
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(program(step))
    assert message in str(info.value) and "cases/x.yaml:" in str(info.value)
