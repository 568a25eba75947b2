"""The current CUDA device and stream: the ``set_device``, ``current_device`` and
``stream_idle`` steps (CUDA only: instances skip where there is no GPU, as for the steps of
:mod:`.cuda`).

- ``{set_device: N}``: ``torch.cuda.set_device(N)`` (an index or an expression over ``rank``,
  ``world_size`` and params), e.g. another rank's GPU before a collective on this rank's
  tensors; the rank's own device is made current again after the instance;
- ``{current_device: N}``: ``torch.cuda.current_device()`` must be N now (a collective must
  not change it behind the caller's back);
- ``{stream_idle: B}``: ``torch.cuda.current_stream().query()`` must return B now: true after
  a synchronous barrier (it blocks the host until earlier work of the stream finished), false
  right after ``wait()`` of an op issued behind a ``delay_stream`` (a wait orders the stream,
  it does not block the host).

Runs in the pytest process: no torch.
"""

from __future__ import annotations

from ...errors import CaseFileError
from ...model import Step
from .base import BuildContext, CheckContext, Path, RawStep, StepKind
from .cuda import devices
from .pgstate import check_count, count_value

ACTIONS = ("set_device", "current_device", "stream_idle")


class DeviceStep(StepKind):
    """``set_device``, ``current_device`` and ``stream_idle``."""

    actions = ACTIONS

    def check(self, ctx: CheckContext, path: Path, step: RawStep,
              action: str) -> list[CaseFileError]:
        """The case's tensors are CUDA tensors; an index expression parses."""
        errs: list[CaseFileError] = []
        if devices(ctx.case) != ["cuda"]:
            errs.append(ctx.case.error((*path, action), f"a {action} step needs CUDA tensors",
                                       "add 'device: cuda' to the case (it skips without a GPU)"))
        if action != "stream_idle":
            errs += check_count(ctx, (*path, action), step[action])
        return errs

    def build(self, step: RawStep, action: str, ctx: BuildContext) -> Step:
        """The step with its device index (or flag) as its value."""
        value = (bool(step[action]) if action == "stream_idle"
                 else count_value(step[action], ctx.names))
        return Step(action, ctx.line, ranks=ctx.ranks, value=value)


KIND = DeviceStep()
