"""The ``drop`` step: ``{drop: H}`` or ``{drop: [H1, H2]}`` lets go of the Works of earlier
async op steps without waiting them, as ``del work`` does in a user's program.

The backend must keep such a collective going on its own: upstream's contract suites drop a
Work, then call a barrier and require the dropped all_reduce's result. A dropped handle is not
waited at the end of the program (the harness waits every other handle there), and it can be
named by no later step. A program with a ``drop`` step runs on a private pool, so a collective
it leaves in flight cannot reach another instance.

Runs in the pytest process: no torch.
"""

from __future__ import annotations

from ...errors import CaseFileError
from ...model import Step
from ..fields import as_list
from .base import BuildContext, CheckContext, Path, RawStep, StepKind


class DropStep(StepKind):
    """``{drop: H}``."""

    actions = ("drop",)

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """Every handle dropped was given by an earlier op step."""
        return [ctx.case.error((*path, "drop"), f"no earlier step has handle {h!r}",
                               "give the async step 'handle: NAME' first")
                for h in as_list(step["drop"]) if h not in ctx.handles]

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step with the handles it lets go of."""
        return Step("drop", ctx.line, ranks=ctx.ranks, waits=tuple(as_list(step["drop"])))


KIND = DropStep()
