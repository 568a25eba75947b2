"""The host steps: ``{sleep: S}`` sleeps S seconds on the host (a rank arriving late), and
``{sync: true}`` synchronizes the device (``torch.cuda.synchronize()`` where CUDA is in use).
Nothing to check beyond the schema and the keys every step shares.
"""

from __future__ import annotations

from ...model import Step
from .base import BuildContext, RawStep, StepKind, value_step


class HostStep(StepKind):
    """``{sleep: S}`` and ``{sync: true}``."""

    actions = ("sleep", "sync")

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step with its seconds (or ``true``) as its value."""
        return value_step(step, action, ctx)


KIND = HostStep()
