"""The ``new_group`` step: ``{new_group: NAME, members|subgroups|split: ...}`` makes a named
process group that later op steps use with ``group: NAME``.

The format's rules live in :mod:`harness.casefile.groups` (which also checks that every
``group: NAME`` of another step names a group made before it, so its checks span the program);
this module plugs them into the registry.
"""

from __future__ import annotations

from ...errors import CaseFileError
from ...model import Step
from .. import groups
from .base import BuildContext, CheckContext, RawStep, StepKind


class NewGroupStep(StepKind):
    """``{new_group: NAME, ...}``."""

    actions = ("new_group",)

    def check_program(self, ctx: CheckContext) -> list[CaseFileError]:
        """Groups made once, with one way of making them, before the steps that name them."""
        return groups.check(ctx.case, ctx.case.raw["steps"])

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The group step (expressions parsed), its membership checked at this world size."""
        made = groups.make_step(step, ctx.line, ctx.ranks, ctx.names)
        groups.check_membership(ctx.case, step, made, ctx.path, ctx.env,
                                ctx.ranks if isinstance(ctx.ranks, tuple) else None)
        return made


KIND = NewGroupStep()
