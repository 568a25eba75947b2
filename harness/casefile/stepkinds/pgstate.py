"""Process-group state a program can state or change: the ``seq_number``, ``work_registry``
and ``enable_timing`` steps (PyTorch's backend contract suites assert each of them).

- ``{seq_number: N}`` (``group:`` a list of ranks or a named group; the world otherwise): the
  group's ``_get_sequence_number_for_group()`` must be N now (an integer or an expression over
  ``rank``, ``world_size`` and params). The count starts at 0 when the group is made and rises
  by one per collective issued on it, so a program with such a step runs on a private pool:
  a pooled world group has counted every earlier instance's collectives.
- ``{work_registry: N}``: ``torch._C._distributed_c10d._get_work_registry_size()`` must be N:
  the Works registered by ``register_work: true`` op steps and not yet waited.
- ``{enable_timing: true}`` (``group:`` as above): ``_enable_collectives_timing()`` of the
  group; Works of collectives issued afterwards report ``_get_duration()`` (a ``work_state``
  step's ``duration:``). Timing stays on for the group, so such a program runs on a private
  pool too.

Instances skip, with the reason, where the installed torch lacks the private method a step
calls (:mod:`harness.run.capabilities`). Runs in the pytest process: no torch.
"""

from __future__ import annotations

from typing import Any

from ...errors import CaseFileError, CaseFileErrors
from ...expr import parse
from ...model import Step
from ..evaluate import group_arg
from ..fields import check_expr
from .base import BuildContext, CheckContext, Path, RawStep, StepKind

ACTIONS = ("seq_number", "work_registry", "enable_timing")
# Steps whose program must not share its process groups with other instances.
PRIVATE = ("seq_number", "enable_timing")


def count_value(raw: Any, names: tuple[str, ...]) -> Any:
    """An integer as given, or the parsed expression (evaluated per rank by the interpreter)."""
    return parse(raw, names) if isinstance(raw, str) else int(raw)


def check_count(ctx: CheckContext, path: Path, raw: Any) -> list[CaseFileError]:
    """An expression given for a count parses (the schema checks the rest)."""
    if not isinstance(raw, str):
        return []
    try:
        check_expr(ctx.case, path, raw)
    except CaseFileErrors as exc:
        return list(exc.errors)
    return []


class ProcessGroupStateStep(StepKind):
    """``seq_number``, ``work_registry`` and ``enable_timing``."""

    actions = ACTIONS

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """A ``seq_number`` expression parses."""
        if action == "seq_number":
            return check_count(ctx, (*path, action), step[action])
        return []

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step with the stated count (or ``True``) as its value and its group in args."""
        args = (("group", group_arg(step["group"])),) if "group" in step else ()
        value = count_value(step[action], ctx.names) if action == "seq_number" else step[action]
        return Step(action, ctx.line, ranks=ctx.ranks, args=args, value=value)


KIND = ProcessGroupStateStep()
