"""Where a run's time goes: per-instance phases, their totals, and the top cost centres.

Each record carries ``phases`` (seconds, measured by the parent around its calls and by the
ranks around their own):

- ``pool_s``: getting the instance's rank pool: a lookup when one is alive, else starting one
  (after a replacement, the next instance of that pool pays the start-up);
- ``run_s``: from the request to the last rank's answer (or the deadline), of which
  ``ranks_s`` is the slowest rank's own time and ``transport_s`` the rest (pipes, waiting for
  a fail-fast grace period, diagnosing a hang or a crash);
- ``probes_s``, ``perf_s``, ``sleep_s``: inside ``ranks_s``, the slowest rank's ordering
  probes, perf timing loop and the case's own ``sleep`` steps;
- ``judge_s``: the verdict; ``settle_s``: deciding whether the pool is reused (the health
  check after a raise or a wrong value) or killed.

The summary's ``time`` block totals them and names the case files that cost most, and
``collective-bench --costs REPORT`` prints the same as a table. Timings are facts about the
machine, never part of a verdict.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..model import PoolRun

PHASES = ("pool_s", "run_s", "ranks_s", "transport_s", "probes_s", "perf_s", "sleep_s",
          "judge_s", "settle_s")
TOP_FILES = 10


def phases(run: PoolRun, *, pool_s: float, run_s: float, judge_s: float,
           settle_s: float) -> dict[str, float]:
    """One instance's phases from the parent's clock readings and the ranks' own."""
    ranks = list(run.results.values())
    ranks_s = max((r.duration for r in ranks), default=0.0)
    out = {"pool_s": pool_s, "run_s": run_s, "ranks_s": ranks_s,
           "transport_s": max(0.0, run_s - ranks_s), "judge_s": judge_s, "settle_s": settle_s}
    for name in ("probes", "perf", "sleep"):
        spent = max((r.phases.get(name, 0.0) for r in ranks), default=0.0)
        if spent:
            out[f"{name}_s"] = spent
    return {k: round(v, 6) for k, v in out.items()}


def totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's ``time`` block: phase totals and the costliest case files."""
    phase_sum: dict[str, float] = defaultdict(float)
    files: dict[str, dict[str, Any]] = {}
    for r in records:
        for k, v in (r.get("phases") or {}).items():
            if k in PHASES and isinstance(v, int | float):
                phase_sum[k] += float(v)
        f = files.setdefault(str(r.get("file", "")), {"file": str(r.get("file", "")),
                                                      "instances": 0, "seconds": 0.0,
                                                      "pools_replaced": 0})
        f["instances"] += 1
        duration = r.get("duration_s", 0.0)
        f["seconds"] += float(duration) if isinstance(duration, int | float) else 0.0
        f["pools_replaced"] += bool(r.get("pool_replaced"))
    by_file = sorted(files.values(), key=lambda f: -f["seconds"])[:TOP_FILES]
    for f in by_file:
        f["seconds"] = round(f["seconds"], 3)
    return {"phases_s": {k: round(phase_sum[k], 3) for k in PHASES if k in phase_sum},
            "by_file": by_file}


def render(report: dict[str, Any]) -> str:
    """The top cost centres of a report as Markdown-ish text for a terminal."""
    records = report.get("records") or []
    block = totals([r for r in records if isinstance(r, dict)])
    executed = [r for r in records if isinstance(r, dict) and r.get("outcome") != "skipped"]
    total = sum(float(r.get("duration_s", 0.0)) for r in executed
                if isinstance(r.get("duration_s", 0.0), int | float))
    lines = [f"{len(executed)} executed instances, {total:.1f} s in instances "
             f"({1000 * total / max(len(executed), 1):.1f} ms each)", "",
             "| phase | seconds | share |", "|---|---|---|"]
    for k, v in block["phases_s"].items():
        share = f"{100 * v / total:.0f} %" if total and k not in ("ranks_s",) else ""
        lines.append(f"| {k} | {v:.1f} | {share} |")
    lines += ["", "| case file | instances | seconds | ms each | pools replaced |",
              "|---|---|---|---|---|"]
    for f in block["by_file"]:
        lines.append(f"| {f['file']} | {f['instances']} | {f['seconds']:.1f} | "
                     f"{1000 * f['seconds'] / max(f['instances'], 1):.0f} | "
                     f"{f['pools_replaced']} |")
    return "\n".join(lines) + "\n"
