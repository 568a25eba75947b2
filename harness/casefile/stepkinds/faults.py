"""The deliberate faults, used to test the harness and to document failure modes:
``{raise: MESSAGE}`` raises on the ranks that run it, ``{abort: true}`` aborts the rank
process, ``{exit: CODE}`` exits it, ``{segfault: true}`` crashes it. Nothing to check beyond
the schema and the keys every step shares.
"""

from __future__ import annotations

from ...model import Step
from .base import BuildContext, RawStep, StepKind, value_step


class FaultStep(StepKind):
    """``raise``, ``abort``, ``exit`` and ``segfault``."""

    actions = ("raise", "abort", "exit", "segfault")

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The fault with its message, code or ``true`` as its value."""
        return value_step(step, action, ctx)


KIND = FaultStep()
