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
import os
from dataclasses import dataclass, field
from typing import Any

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


def entries_from_report(report: dict[str, Any]) -> dict[str, PerfEntry]:
    """The timed instances of a report (its top-level ``perf.points``)."""
    perf = report.get("perf")
    if not perf:
        raise BaselineError("the report has no perf section\n    hint: run pytest with --perf "
                            "(e.g. pytest cases/perf.yaml --perf)")
    return {p["key"]: PerfEntry(p["key"], int(p["bytes"]), float(p["busbw_gbs"]),
                                float(p["busbw_gbs_min"]), float(p["busbw_gbs_max"]))
            for p in perf["points"]}


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
            threshold: float | None = None) -> PerfResult:
    """Classify every instance of ``report`` against ``base``."""
    now = entries_from_report(report)
    thr = base.threshold if threshold is None else threshold
    deltas = [classify(base.entries[k], now[k], thr, base.min_bytes)
              for k in sorted(now) if k in base.entries]
    warnings = []
    mine = facts_of(report)
    for k, v in base.facts.items():
        if mine.get(k) != v:
            warnings.append(f"{k} differs: report {mine.get(k)!r}, baseline {v!r} (the numbers "
                            "may not be comparable)")
    return PerfResult(deltas, sorted(set(base.entries) - set(now)),
                      sorted(set(now) - set(base.entries)), thr, warnings)


def load(path: str) -> PerfBaseline:
    """Read a perf baseline; :class:`BaselineError` with the fix when it is unusable."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise BaselineError(f"{path}: perf baseline not found\n    hint: create it with "
                            f"collective-gate --perf REPORT {path} --update") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise BaselineError(f"{path}: not a perf baseline (expected \"kind\": \"{KIND}\")"
                            "\n    hint: conformance baselines are gated without --perf")
    thr = doc.get("threshold", DEFAULT_THRESHOLD)
    if not isinstance(thr, int | float) or not 0 <= thr < 10:
        raise BaselineError(f"{path}: threshold {thr!r}: write a relative drop such as 0.1")
    try:
        entries = {e["key"]: PerfEntry(e["key"], int(e["bytes"]), float(e["busbw_gbs"]),
                                       float(e["busbw_gbs_min"]), float(e["busbw_gbs_max"]))
                   for e in doc.get("points", [])}
    except (KeyError, TypeError, ValueError) as exc:
        raise BaselineError(f"{path}: a point lacks {exc} (key, bytes, busbw_gbs, "
                            "busbw_gbs_min, busbw_gbs_max)") from None
    return PerfBaseline(entries, float(thr), int(doc.get("min_bytes", 0)),
                        dict(doc.get("facts", {})))


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


def update(report: dict[str, Any], path: str, threshold: float | None) -> str:
    """Write the perf baseline at ``path`` from ``report`` (threshold and min_bytes kept)."""
    old: PerfBaseline | None = None
    if os.path.exists(path):
        old = load(path)
    new = PerfBaseline(entries_from_report(report),
                       threshold if threshold is not None
                       else (old.threshold if old else DEFAULT_THRESHOLD),
                       old.min_bytes if old else 0, facts_of(report))
    write(path, new)
    return (f"collective-gate: wrote {path}: {len(new.entries)} points, threshold "
            f"{new.threshold:g}, min_bytes {new.min_bytes}\n")


def _line(d: Delta) -> str:
    return (f"  {d.key}: busbw {d.base:.4g} -> {d.now:.4g} GB/s ({d.change * 100:+.1f}%, "
            f"noise {d.noise * 100:.1f}%)")


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
                   + ", ".join(res.missing[:10]) + (" ..." if len(res.missing) > 10 else "")
                   + "\n")
    return "".join(out)


def to_json(res: PerfResult) -> dict[str, Any]:
    """The result for tools."""
    return {"ok": res.ok, "threshold": res.threshold, "warnings": res.warnings,
            "missing": res.missing, "new": res.new,
            "deltas": [vars(d) for d in res.deltas]}
