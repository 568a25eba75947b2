"""Which instances ``--perf`` times, and with which loop settings (parent side).

An instance is timed when it passed its correctness check and its program is made of op,
wait and sync steps on tensors only (the ``op:`` shorthand and plain programs such as a
send/recv ring): sleeps, ordering steps, deliberate faults, object collectives and instances
expected to raise, hang or crash have no meaningful bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from ..model import Instance, PerfPlan

TIMED_STEPS = frozenset({"op", "wait", "sync"})
# The largest value each setting takes: the timing loop also stops at its own time budget
# (PerfPlan.budget_s), so these only keep a typo from asking for something absurd.
MAXIMA = {"--perf-warmup": 1_000_000, "--perf-iters": 1_000_000_000,
          "--perf-min-time": 3600.0, "--perf-repeats": 1000}
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
)


def add_options(group: Any, parser: pytest.Parser) -> None:
    """``--perf`` and the loop settings, each with an ini fallback."""
    group.addoption("--perf", dest="collective_perf", action="store_true", default=False,
                    help="after each passing instance's check, time its op like nccl-tests "
                         "and report time, algbw and busbw (also runs cases marked 'perf')")
    parser.addini("collective_perf", "performance mode on (true/false)", type="bool",
                  default=False)
    for opt, ini, typ, default, text in SETTINGS:
        group.addoption(opt, dest=ini, type=typ, default=None, metavar="N", help=text)
        parser.addini(ini, text, default=str(default))


def enabled(config: pytest.Config) -> bool:
    """Whether this session runs in performance mode."""
    return bool(config.getoption("collective_perf") or config.getini("collective_perf"))


def settings(config: pytest.Config) -> PerfPlan:
    """The loop settings of this session (options win over ini values)."""
    values: dict[str, Any] = {}
    for opt, ini, typ, _, _ in SETTINGS:
        raw = config.getoption(ini)
        if raw is None:
            try:
                raw = typ(str(config.getini(ini)))
            except ValueError:
                raise pytest.UsageError(f"ini {ini} = {config.getini(ini)!r}: not a "
                                        f"{typ.__name__}") from None
        least = 1 if opt in ("--perf-iters", "--perf-repeats") else 0
        if not (math.isfinite(raw) and least <= raw <= MAXIMA[opt]):
            raise pytest.UsageError(f"{opt} {raw}: must be a finite number from {least} to "
                                    f"{MAXIMA[opt]:,}")
        values[opt[len("--perf-"):].replace("-", "_")] = raw
    return PerfPlan(warmup=values["warmup"], iters=values["iters"],
                    min_time_s=values["min_time"], repeats=values["repeats"])


def options(config: pytest.Config) -> dict[str, Any]:
    """The perf settings as report metadata (``perf: null`` when the mode is off)."""
    if not enabled(config):
        return {"perf": None}
    return {"perf": dataclasses.asdict(settings(config))}


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


def configure(inst: Instance, config: pytest.Config) -> Instance:
    """Attach the perf plan to a timeable instance of a ``--perf`` session."""
    if not enabled(config) or not_timed(inst):
        return inst
    deadline = inst.deadline or float(config.getoption("collective_deadline")
                                      or config.getini("collective_deadline"))
    plan = dataclasses.replace(settings(config),
                               budget_s=min(BUDGET_S, BUDGET_SHARE * deadline))
    return dataclasses.replace(inst, perf=plan)
