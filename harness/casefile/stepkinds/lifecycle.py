"""The process-group lifecycle steps: ``{set_timeout: S}`` (``ProcessGroup.set_timeout``) and
``{destroy: true}`` (``destroy_process_group``) and ``{abort_group: true}`` (torch's
``_abort_process_group``), each on the world group or on ``group:``
(``group_timeout:`` beside it makes that subgroup with a timeout).

Their keys (``set_timeout``'s seconds, ``group_timeout``, ``raises``) are checked with every
step's timeout and error keys in :mod:`harness.casefile.lifecycle`, which also says why a
program that uses them runs on a private rank pool.
"""

from __future__ import annotations

from typing import Any

from ...model import Step
from .. import lifecycle
from ..evaluate import group_arg
from .base import BuildContext, RawStep, StepKind


class LifecycleStep(StepKind):
    """``set_timeout``, ``destroy`` and ``abort_group``."""

    actions = lifecycle.LIFECYCLE_ACTIONS

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step with its group (and that group's timeout), and the new timeout's seconds
        for ``set_timeout``."""
        group_args: tuple[tuple[str, Any], ...] = (
            (("group", group_arg(step["group"])),) if "group" in step else ())
        if "group_timeout" in step:
            group_args = (*group_args, ("group_timeout", float(step["group_timeout"])))
        return Step(action, ctx.line, ranks=ctx.ranks, args=group_args,
                    value=float(step[action]) if action == "set_timeout" else None,
                    **lifecycle.step_fields(step))


KIND = LifecycleStep()
