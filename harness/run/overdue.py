"""Ranks past the bound of the step they are in (``raises: {within: S}``).

A survivor must notice a dead peer in bounded time; one that hangs instead would otherwise be
found only at the instance's deadline. The parent reads each pending rank's step from its
progress slot and notes when it first saw the rank in a bounded step; once a rank has stayed
there longer than the bound plus :data:`SLACK_S`, the wait ends and the verdict names the
step. The time is counted from when the parent first saw the rank in the step, which is no
earlier than the rank entered it: an overdue rank is overdue for certain, and load can only
make the harness later to say so, never make it say so wrongly.
"""

from __future__ import annotations

from ..model import Instance

SLACK_S = 2.0  # beyond the bound: the parent's polling and a loaded machine
POLL_S = 0.25


class Overdue:
    """The bounded steps of one instance, and when each pending rank was seen entering one."""

    def __init__(self, inst: Instance) -> None:
        self.bounds = {i: float(s.raises_within) for i, s in enumerate(inst.steps)
                       if s.raises_within is not None}
        self.seen: dict[int, tuple[int, float]] = {}

    @property
    def active(self) -> bool:
        """Whether the instance has any bounded step."""
        return bool(self.bounds)

    def check(self, now: float, steps: dict[int, int]) -> list[tuple[int, int, float]]:
        """(rank, step, seconds seen in it) for each rank past its step's bound."""
        out: list[tuple[int, int, float]] = []
        for rank, step in sorted(steps.items()):
            if step not in self.bounds:
                self.seen.pop(rank, None)
                continue
            first = self.seen.get(rank)
            if first is None or first[0] != step:
                self.seen[rank] = (step, now)
            elif now - first[1] > self.bounds[step] + SLACK_S:
                out.append((rank, step, now - first[1]))
        return out
