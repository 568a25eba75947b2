"""Recovery after a death: ``{reform: [0, 2]}`` and ``{shrink: [1]}``.

``reform``: its members (``survivors``: the ranks alive when it comes) destroy the world
group and initialise a new one among themselves, through the pool's store under a fresh
prefix, ranked in the list's order (what an elastic job does after losing a peer,
backend-agnostic: for torchft's process groups the factory's reconfigure runs).
``shrink``: ``torch.distributed.shrink_group(ranks_to_exclude=LIST)`` of the world, on the
others (torch 2.13 has it; backends that cannot shrink raise TypeError, which ``raises:``
states). Either way later op steps run on the new world, and the ranks a
step names (``src``, ``dst``, peers, ``group:`` lists) stay the launch's: the harness maps them
to the new world's. Each runs on its members unless ``ranks:`` says otherwise; a member that
died before it is an error at collection (:mod:`harness.casefile.deaths`).
"""

from __future__ import annotations

from ...errors import CaseFileError
from ...model import Step
from .. import lifecycle
from ..deaths import SURVIVORS
from .base import BuildContext, CheckContext, Path, RawStep, StepKind


class RecoveryStep(StepKind):
    """``reform`` and ``shrink``."""

    actions = ("reform", "shrink")

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """Ranks named once each; ``survivors`` only for ``reform``."""
        listed = step[action]
        if isinstance(listed, str) and (action != "reform" or listed != SURVIVORS):
            return [ctx.case.error((*path, action), f"{action}: {listed!r} is not a list of "
                                   "ranks", "{reform: survivors} re-forms the ranks alive"
                                   if action == "reform" else "e.g. {shrink: [1]}")]
        if isinstance(listed, list) and len(set(listed)) != len(listed):
            return [ctx.case.error((*path, action), f"{action} names a rank twice: {listed}",
                                   "list each rank once")]
        return []

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step, run on the ranks that go on (unless ``ranks:`` says otherwise;
        ``survivors`` is made concrete with the program's deaths, harness.casefile.deaths)."""
        if step[action] == SURVIVORS:
            return Step(action, ctx.line, ranks=ctx.ranks, value=SURVIVORS,
                        **lifecycle.step_fields(step))
        listed = tuple(int(r) for r in step[action])
        ws = int(ctx.point["world_size"])
        bad = [r for r in listed if r >= ws]
        if bad:
            raise ctx.case.error((*ctx.path, action), f"{action} names rank {bad[0]}, outside "
                                 f"world_size {ws}", f"ranks are 0..{ws - 1}")
        going_on = listed if action == "reform" else tuple(r for r in range(ws)
                                                           if r not in listed)
        return Step(action, ctx.line, ranks=ctx.ranks if ctx.ranks is not None else going_on,
                    value=listed, **lifecycle.step_fields(step))


KIND = RecoveryStep()
