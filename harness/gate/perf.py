"""The perf gate: a ``--perf`` report's busbw against a perf baseline, noise-aware.

    collective-gate --perf reports/conformance.json ci/baselines/gloo-cpu-perf.json
    collective-gate --perf reports/conformance.json ci/baselines/gloo-cpu-perf.json --update

A perf baseline holds one entry per timed instance (its key, size, and busbw: the median over
repeats with the slowest and fastest repeat's value), plus the gate's ``threshold`` (relative,
default 0.10) and ``min_bytes`` (smaller messages are not gated; default 0). Both are kept
across ``--update``. For each instance in both files:

- ``change = (now - base) / base`` on the medians;
- ``noise`` = the relative half-spread of the baseline's repeats plus that of this run's
  (``(max - min) / 2 / median`` of busbw, each side);
- a **regression** when the drop beyond the noise exceeds the threshold
  (``-change - noise > threshold``), an **improvement** when the gain beyond the noise does
  (``change - noise > threshold``), else **unchanged**.

So a drop the repeats themselves show to be within the run-to-run scatter never fails, and a
quiet run fails on a smaller real drop than a noisy one. Only regressions fail (exit 1);
improvements are reported (refresh the baseline to lock them in), as are instances missing on
either side. Numbers from different backends, devices or torch versions are not comparable:
the gate says so first.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import quote
from ..report.jsonfile import UnreadableFile, printable, read_json
from ..report.records import write_atomic
from .baseline import BaselineError

KIND = "collective-harness perf baseline"
DEFAULT_THRESHOLD = 0.10


@dataclass
class PerfEntry:
    """One timed instance: identity, size, busbw median and the repeats' range."""

    key: str
    bytes: int
    busbw: float
    busbw_min: float
    busbw_max: float

    def noise(self) -> float:
        """Relative half-spread of busbw over the repeats."""
        return (self.busbw_max - self.busbw_min) / 2 / self.busbw if self.busbw > 0 else 0.0


@dataclass
class PerfBaseline:
    """A perf baseline file."""

    entries: dict[str, PerfEntry]
    threshold: float = DEFAULT_THRESHOLD
    min_bytes: int = 0
    facts: dict[str, Any] = field(default_factory=dict)  # backend, devices, torch of the run


@dataclass
class Delta:
    """One instance compared."""

    key: str
    category: str  # regression, improvement, unchanged, below_min_bytes
    base: float
    now: float
    change: float
    noise: float


@dataclass
class PerfResult:
    """Every instance classified, and the verdict."""

    deltas: list[Delta]
    missing: list[str]
    new: list[str]
    threshold: float
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not any(d.category == "regression" for d in self.deltas)

    def of(self, category: str) -> list[Delta]:
        return [d for d in self.deltas if d.category == category]


def entries_from_report(report: dict[str, Any], where: str = "the report"
                        ) -> dict[str, PerfEntry]:
    """The timed instances of a report (its top-level ``perf.points``); ``where`` names the
    report in errors."""
    perf = report.get("perf")
    if not perf:
        raise BaselineError(f"{where}: the report has no perf section; run pytest with --perf "
                            "(e.g. pytest cases/perf.yaml --perf)")
    return {e.key: e for e in (_point(where, p) for p in perf["points"])}


def facts_of(report: dict[str, Any]) -> dict[str, Any]:
    """What must match for numbers to be comparable."""
    meta = report["metadata"]
    return {"backends": meta.get("backends", []), "devices": meta.get("devices", []),
            "torch": meta.get("torch", ""),
            "cuda_device_names": meta.get("cuda_device_names", []),
            "cpu_model": (report.get("perf", {}).get("host") or {}).get("cpu_model", "")}


def classify(base: PerfEntry, now: PerfEntry, threshold: float, min_bytes: int) -> Delta:
    """One instance: regression, improvement or unchanged (see the module docstring)."""
    change = (now.busbw - base.busbw) / base.busbw if base.busbw > 0 else 0.0
    noise = base.noise() + now.noise()
    if now.bytes < min_bytes:
        category = "below_min_bytes"
    elif -change - noise > threshold:
        category = "regression"
    elif change - noise > threshold:
        category = "improvement"
    else:
        category = "unchanged"
    return Delta(now.key, category, base.busbw, now.busbw, change, noise)


def compare(report: dict[str, Any], base: PerfBaseline,
            threshold: float | None = None, where: str = "the report") -> PerfResult:
    """Classify every instance of ``report`` (read from ``where``) against ``base``."""
    now = entries_from_report(report, where)
    thr = base.threshold if threshold is None else threshold
    deltas = [classify(base.entries[k], now[k], thr, base.min_bytes)
              for k in sorted(now) if k in base.entries]
    warnings = []
    mine = facts_of(report)
    for k, v in base.facts.items():
        if mine.get(k) != v:
            warnings.append(f"{printable(k, 60)} differs: report {quote(mine.get(k), 120)}, "
                            f"baseline {quote(v, 120)} (the numbers may not be comparable)")
    return PerfResult(deltas, sorted(set(base.entries) - set(now)),
                      sorted(set(now) - set(base.entries)), thr, warnings)


def _point(where: str, p: Any) -> PerfEntry:
    """One point of a report's perf section or a perf baseline, every number checked finite."""
    try:
        key = p["key"]
        nums = [p[k] for k in ("bytes", "busbw_gbs", "busbw_gbs_min", "busbw_gbs_max")]
    except (KeyError, TypeError):
        raise BaselineError(f"{where}: a point lacks one of key, bytes, busbw_gbs, "
                            "busbw_gbs_min, busbw_gbs_max") from None
    if not isinstance(key, str):
        raise BaselineError(f"{where}: a point's key is not a string")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
               and x >= 0 for x in nums) or not isinstance(nums[0], int):
        raise BaselineError(f"{where}: point {printable(key, 120)}: bytes and busbw must be "
                            "finite numbers >= 0 (bytes an integer)")
    return PerfEntry(key, nums[0], float(nums[1]), float(nums[2]), float(nums[3]))


def load(path: str) -> PerfBaseline:
    """Read a perf baseline; :class:`BaselineError` (one line) with the fix when unusable."""
    try:
        doc = read_json(path, "perf baseline", " (create it with: collective-gate --perf "
                        f"REPORT {path} --update)")
    except UnreadableFile as exc:
        raise BaselineError(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise BaselineError(f"{path}: not a perf baseline (expected \"kind\": \"{KIND}\"); "
                            "conformance baselines are gated without --perf")
    thr = doc.get("threshold", DEFAULT_THRESHOLD)
    if isinstance(thr, bool) or not isinstance(thr, int | float) or not 0 <= thr < 10:
        raise BaselineError(f"{path}: threshold {quote(thr, 40)}: write a relative drop such "
                            "as 0.1")
    min_bytes = doc.get("min_bytes", 0)
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise BaselineError(f"{path}: min_bytes {quote(min_bytes, 40)}: write a number of "
                            "bytes such as 0")
    points, facts = doc.get("points", []), doc.get("facts", {})
    if not isinstance(points, list) or not isinstance(facts, dict):
        raise BaselineError(f"{path}: \"points\" must be a list and \"facts\" an object")
    entries = {e.key: e for e in (_point(path, p) for p in points)}
    return PerfBaseline(entries, float(thr), min_bytes, dict(facts))


def write(path: str, base: PerfBaseline) -> None:
    """Write ``base`` with one sorted point per line (reviewable diffs)."""
    head = {"kind": KIND, "threshold": base.threshold, "min_bytes": base.min_bytes,
            "facts": base.facts}
    lines = [json.dumps({"key": e.key, "bytes": e.bytes, "busbw_gbs": e.busbw,
                         "busbw_gbs_min": e.busbw_min, "busbw_gbs_max": e.busbw_max})
             for _, e in sorted(base.entries.items())]
    text = json.dumps(head, indent=1)[:-2] + ',\n "points": [\n  ' + ",\n  ".join(lines) \
        + "\n ]\n}\n"
    write_atomic(path, text)


def update(report: dict[str, Any], path: str, threshold: float | None,
           where: str = "the report") -> str:
    """Write the perf baseline at ``path`` from ``report`` (read from ``where``; threshold and
    min_bytes kept)."""
    old: PerfBaseline | None = None
    if os.path.exists(path):
        old = load(path)
    new = PerfBaseline(entries_from_report(report, where),
                       threshold if threshold is not None
                       else (old.threshold if old else DEFAULT_THRESHOLD),
                       old.min_bytes if old else 0, facts_of(report))
    write(path, new)
    return (f"collective-gate: wrote {path}: {len(new.entries)} points, threshold "
            f"{new.threshold:g}, min_bytes {new.min_bytes}\n")


def _line(d: Delta) -> str:
    return (f"  {printable(d.key, 300)}: busbw {d.base:.4g} -> {d.now:.4g} GB/s "
            f"({d.change * 100:+.1f}%, noise {d.noise * 100:.1f}%)")


def render_text(res: PerfResult, max_list: int = 200) -> str:
    """The verdict first, then regressions and improvements with their numbers."""
    counts = {c: len(res.of(c)) for c in ("regression", "improvement", "unchanged",
                                          "below_min_bytes")}
    head = (f"collective-gate --perf: {'PASS' if res.ok else 'FAIL'}: "
            + ", ".join(f"{n} {c}" for c, n in counts.items() if n)
            + f"; {len(res.missing)} missing, {len(res.new)} new "
            f"(threshold {res.threshold * 100:g}% beyond the repeats' spread)\n")
    out = [head] + [f"  warning: {w}\n" for w in res.warnings]
    for cat, title in (("regression", "Regressions (fail)"), ("improvement", "Improvements")):
        items = res.of(cat)
        if items:
            out.append(f"\n{title} ({len(items)}):\n")
            out += [_line(d) + "\n" for d in items[:max_list]]
            if len(items) > max_list:
                out.append(f"  ... and {len(items) - max_list} more\n")
    if res.missing:
        out.append(f"\nMissing from the report ({len(res.missing)}): "
                   + ", ".join(printable(k, 300) for k in res.missing[:10])
                   + (" ..." if len(res.missing) > 10 else "")
                   + "\n")
    return "".join(out)


def to_json(res: PerfResult) -> dict[str, Any]:
    """The result for tools."""
    return {"ok": res.ok, "threshold": res.threshold, "warnings": res.warnings,
            "missing": res.missing, "new": res.new,
            "deltas": [vars(d) for d in res.deltas]}
