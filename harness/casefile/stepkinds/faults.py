"""The deliberate faults: ``{raise: MESSAGE}`` raises on the ranks that run it, ``{abort:
true}`` aborts the rank process, ``{exit: CODE}`` exits it, ``{segfault: true}`` crashes it,
``{kill: true}`` sends it SIGKILL, ``{stall: true}`` makes it stop answering without dying.
With ``crashes: true`` they document failure modes; without it, a death is planned and the
survivors' program goes on (:mod:`harness.casefile.deaths` checks what may follow a death).
"""

from __future__ import annotations

from ...model import Step
from .base import BuildContext, RawStep, StepKind, value_step


class FaultStep(StepKind):
    """``raise``, ``abort``, ``exit``, ``segfault``, ``kill`` and ``stall``."""

    actions = ("raise", "abort", "exit", "segfault", "kill", "stall")

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The fault with its message, code or ``true`` as its value."""
        return value_step(step, action, ctx)


KIND = FaultStep()
