"""The ``identity`` step: what a process group says about this rank, against the launch.

``{identity: world}`` (or ``{identity: NAME}``, a group a ``new_group`` step made) checks, on
every rank that runs it, that ``dist.get_rank(group)``, ``dist.get_world_size(group)``, the
group object's own ``rank()`` and ``size()``, and ``dist.get_backend(group)`` agree with how
the rank was launched (its rank, the world size or the group's members, the session's backend
name). Everything else a backend is checked on rests on these answers: torch reads
``get_rank()`` for the root checks of gather/scatter and the object collectives and for the
ranks of every group made from the world, so a backend that answers rank 0 on every process
fails hundreds of unrelated instances. A certificate runs these first
(:mod:`harness.certify.identity`).

Runs in the pytest process: no torch.
"""

from __future__ import annotations

from ...errors import CaseFileError
from ...model import Step
from .base import BuildContext, CheckContext, Path, RawStep, StepKind

WORLD = "world"


class IdentityStep(StepKind):
    """``{identity: world}`` or ``{identity: NAME}``."""

    actions = ("identity",)

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """The world, or a group some ``new_group`` step of the program makes."""
        name = step["identity"]
        made = {s.get("new_group") for s in ctx.case.raw.get("steps", [])}
        if name != WORLD and name not in made:
            return [ctx.case.error((*path, "identity"), f"no new_group step makes a group "
                                   f"named {name!r}", "{identity: world}, or the name of a "
                                   "group a new_group step makes before this step")]
        return []

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step naming the group it asks about ("world": the instance's world)."""
        return Step("identity", ctx.line, ranks=ctx.ranks, value=str(step["identity"]))


KIND = IdentityStep()
