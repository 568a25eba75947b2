"""Which instances ``--perf`` times, and with which loop settings (parent side).

An instance is timed when it passed its correctness check and its program is made of op,
wait and sync steps on tensors only (the ``op:`` shorthand and plain programs such as a
send/recv ring): sleeps, ordering steps, deliberate faults, object collectives and instances
expected to raise, hang or crash have no meaningful bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..model import Instance, PerfPlan

TIMED_STEPS = frozenset({"op", "wait", "sync"})
# The largest value each setting takes: the timing loop also stops at its own time budget
# (PerfPlan.budget_s), so these only keep a typo from asking for something absurd.
MAXIMA = {"--perf-warmup": 1_000_000, "--perf-iters": 1_000_000_000,
          "--perf-min-time": 3600.0, "--perf-repeats": 1000, "--perf-check": 100}
# (option, ini, type, default, help)
SETTINGS: tuple[tuple[str, str, type, Any, str], ...] = (
    ("--perf-warmup", "collective_perf_warmup", int, 5,
     "untimed iterations before the timed ones (default 5)"),
    ("--perf-iters", "collective_perf_iters", int, 20,
     "least iterations per timed block (default 20)"),
    ("--perf-min-time", "collective_perf_min_time", float, 0.02,
     "least seconds per timed block: more iterations when the op is fast (default 0.02)"),
    ("--perf-repeats", "collective_perf_repeats", int, 5,
     "timed blocks; the report gives their median and spread (default 5)"),
    ("--perf-check", "collective_perf_check", int, 0,
     "checked runs after the timing loop, on its buffers, each freshly poisoned and fully "
     "checked (nccl-tests -c; default 0)"),
)


@dataclass(frozen=True)
class PerfSettings:
    """The session's performance mode: on or off (``--perf``), and the loop settings."""

    enabled: bool = False
    loop: PerfPlan = field(default_factory=PerfPlan)

    def metadata(self) -> dict[str, Any]:
        """The perf settings as report metadata (``perf: null`` when the mode is off)."""
        return {"perf": dataclasses.asdict(self.loop) if self.enabled else None}


def loop_settings(values: dict[str, Any]) -> PerfPlan:
    """The loop settings from raw values by option (``"--perf-iters": "40"``; missing ones
    take their defaults); ValueError naming the option when one is not a number in range."""
    out: dict[str, Any] = {}
    for opt, _ini, typ, default, _ in SETTINGS:
        raw = values.get(opt)
        try:
            number = default if raw is None else typ(str(raw))
        except ValueError:
            raise ValueError(f"{opt} {str(raw)[:40]!r}: not a {typ.__name__}") from None
        least = 1 if opt in ("--perf-iters", "--perf-repeats") else 0
        if not (math.isfinite(number) and least <= number <= MAXIMA[opt]):
            raise ValueError(f"{opt} {number}: must be a finite number from {least} to "
                             f"{MAXIMA[opt]:,}")
        out[opt[len("--perf-"):].replace("-", "_")] = number
    return PerfPlan(warmup=out["warmup"], iters=out["iters"], min_time_s=out["min_time"],
                    repeats=out["repeats"], check=out["check"])


def not_timed(inst: Instance) -> str:
    """Why ``inst`` gets no bandwidth even when it passes ("" when it is timed)."""
    if inst.expectation.kind != "pass":
        verb = {"raises": "raise", "hangs": "hang", "crashes": "crash"}[inst.expectation.kind]
        return f"the case expects the instance to {verb}"
    if inst.expectation.xfail:
        return "a known divergence (xfail)"
    kinds = sorted({s.kind for s in inst.steps} - TIMED_STEPS)
    if kinds:
        return f"the program has {', '.join(kinds)} steps"
    if not any(s.kind == "op" for s in inst.steps):
        return "the program calls no op"
    if any(s.raises is not None for s in inst.steps):
        return "a step of the program must raise"
    if any(t.dtype == "object" for t in inst.tensors):
        return "object collectives move pickled objects, not a buffer"
    return ""


# The timing loop's budget: at most this, and at most this share of the instance's deadline
# (the correctness run needs the rest; the deadline must never be what stops the timing).
BUDGET_S = 20.0
BUDGET_SHARE = 0.4


def configure(inst: Instance, settings: PerfSettings, deadline_s: float) -> Instance:
    """Attach the perf plan to a timeable instance of a ``--perf`` session (``deadline_s``:
    the instance's deadline, of which the timing may take a share)."""
    if not settings.enabled or not_timed(inst):
        return inst
    plan = dataclasses.replace(settings.loop, budget_s=min(BUDGET_S, BUDGET_SHARE * deadline_s))
    return dataclasses.replace(inst, perf=plan)
