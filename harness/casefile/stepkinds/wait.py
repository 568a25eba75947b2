"""The ``wait`` step: ``{wait: H}`` or ``{wait: [H1, H2]}`` waits the Works of earlier async
op steps, in the order given.

``timeout: S`` calls ``work.wait(timedelta(seconds=S))`` first (a Work that misses the bound
raises there); ``thread: true`` calls ``wait()`` from another thread (an ordering check, see
docs/howto/async-ordering.md); ``register_work: true`` waits inside
``allow_inflight_collective_as_graph_input_ctx()``, where a wait also removes the Work from the
registry (``work_registry`` steps); ``raises:`` states that the wait must fail
(:mod:`harness.casefile.lifecycle`).
"""

from __future__ import annotations

from typing import Any

from ...errors import CaseFileError
from ...model import Step
from .. import lifecycle
from ..fields import as_list
from .base import BuildContext, CheckContext, Path, RawStep, StepKind


class WaitStep(StepKind):
    """``{wait: H}``; its problems come after every common check of the step."""

    actions = ("wait",)

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """Every handle waited was given by an earlier op step."""
        return [ctx.case.error((*path, "wait"), f"no earlier step has handle {h!r}",
                               "give the async step 'handle: NAME' first")
                for h in as_list(step["wait"]) if h not in ctx.handles]

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The wait with its handles, ``thread`` and ``timeout``."""
        wait_args: tuple[tuple[str, Any], ...] = (
            (("thread", True),) if step.get("thread") else ())
        if "timeout" in step:
            wait_args = (*wait_args, ("timeout", float(step["timeout"])))
        return Step("wait", ctx.line, ranks=ctx.ranks, waits=tuple(as_list(step["wait"])),
                    args=wait_args, register_work=bool(step.get("register_work", False)),
                    **lifecycle.step_fields(step))


KIND = WaitStep()
