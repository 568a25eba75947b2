"""Planning of the async-contract checks (parent side; no torch).

Which instances get an :class:`~harness.model.OrderingPlan` (every instance with async work or
declared reads), which of them run the delayed probes (a representative sample by default),
which rank is delayed, and the ``--ordering`` options. The contract itself and the verdicts
are described in :mod:`harness.ordering.verdicts`.
"""


from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .. import ops
from ..model import DEFAULT_ORDERING_DELAY_S, Instance, OrderingPlan

MODES = ("sample", "all", "none")


def _members(inst: Instance) -> tuple[int, ...]:
    group = dict(inst.steps[0].args).get("group") if inst.steps else None
    return tuple(group) if group else tuple(range(inst.world_size))


def delayed_rank(inst: Instance) -> int:
    """The rank to delay so that every other member's result depends on it.

    A rooted op's source (broadcast, scatter) feeds everyone; otherwise any member but the
    destination (reduce, gather), whose result needs every contribution.
    """
    members = _members(inst)
    args = dict(inst.steps[0].args) if inst.steps else {}
    src = args.get("src")
    dst = args.get("dst")
    root, op = args.get("root_rank"), ops.ALL_OPS.get(inst.op)
    if op is not None and op.root_feeds is not None and isinstance(root, int) and (
            0 <= root < len(members)):  # a position in the group (process-group methods)
        src, dst = (members[root], dst) if op.root_feeds else (src, members[root])
    if isinstance(src, int) and src in members:
        return src
    others = [m for m in members if m != dst]
    return (others or list(members))[-1]


def plan_instances(mode: str, instances: list[Instance]) -> list[Instance]:
    """Attach an :class:`OrderingPlan` to every instance of one case that has async work."""
    out: list[Instance] = []
    sampled_points: set[tuple[int, str]] = set()
    for inst in instances:
        async_steps = any(s.kind == "op" and s.async_op for s in inst.steps)
        declared = any(s.kind in ("read", "future") and s.value is not None
                       for s in inst.steps)
        if not (async_steps or declared):
            out.append(inst)
            continue
        shorthand_async = inst.shorthand is not None and inst.async_op
        point = (inst.world_size, inst.device)
        sampled = shorthand_async and point not in sampled_points
        if sampled:
            sampled_points.add(point)
        plan = OrderingPlan(mode=mode, sampled=sampled, shorthand_async=shorthand_async,
                            async_steps=async_steps, declared=declared,
                            members=_members(inst), delayed_rank=delayed_rank(inst))
        out.append(replace(inst, ordering=plan))
    return out


@dataclass(frozen=True)
class OrderingSettings:
    """The session's probe settings: ``--ordering`` (``auto`` follows each case's own
    ``ordering:``) and ``--ordering-delay``. A plain value, so that every front end (pytest,
    the fuzzer, external mode) configures instances the same way."""

    mode: str = "auto"
    delay_s: float = DEFAULT_ORDERING_DELAY_S

    def __post_init__(self) -> None:
        if self.mode not in ("auto", *MODES):
            raise ValueError(f"--ordering {self.mode!r}: choose one of auto, {', '.join(MODES)}")
        if not (isinstance(self.delay_s, int | float) and math.isfinite(self.delay_s)
                and 0 <= self.delay_s <= MAX_DELAY_S):
            raise ValueError(f"--ordering-delay {self.delay_s!r}: must be a number of seconds "
                             f"from 0 to {MAX_DELAY_S:g}")

    def metadata(self) -> dict[str, Any]:
        """The effective ordering options (echoed in the report metadata)."""
        return {"ordering": self.mode, "ordering_delay_s": float(self.delay_s)}


MAX_DELAY_S = 60.0  # a probe delay is a sleep in one rank: the operator's --max-sleep scale
# (flags, dest and ini name, default, help, choices): the plugin registers them and the options
# page lists them from here.
OPTIONS: tuple[tuple[tuple[str, ...], str, str, str, tuple[str, ...]], ...] = (
    (("--ordering", "--collective-ordering"), "collective_ordering", "auto",
     "async-contract probes: auto (each case's 'ordering:', default sample), sample, all, none",
     ("auto", *MODES)),
    (("--ordering-delay",), "collective_ordering_delay", str(DEFAULT_ORDERING_DELAY_S),
     f"delay injected by the ordering probes, in seconds (default {DEFAULT_ORDERING_DELAY_S})",
     ()),
)


def configure(inst: Instance, settings: OrderingSettings) -> Instance:
    """Decide, after overrides are applied, whether this instance runs the delayed probes.

    (Which checks an override documents as known divergences is recorded by
    :func:`harness.casefile.overrides.resolve`.)
    """
    plan = inst.ordering
    if plan is None:
        return inst
    mode = plan.mode if settings.mode == "auto" else settings.mode
    # The probes' slow producers write into the buffer in place, which a sparse COO tensor
    # does not support: sparse instances run without them (docs/reference/case-format.md).
    probes = (plan.shorthand_async and inst.expectation.kind == "pass"
              and (mode == "all" or (mode == "sample" and plan.sampled))
              and not any(t.sparse is not None for t in inst.tensors))
    return replace(inst, ordering=replace(plan, probes=probes, delay_s=settings.delay_s))
