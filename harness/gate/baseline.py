"""Baselines: the committed record of how each instance behaved, for the CI gate.

A baseline is a JSON file (``ci/baselines/*.json``) with one entry per instance, keyed by the
case id (``file::case``) and the instance's axes, never by pytest node id, so it is stable
across machines, rootdirs and pytest versions. The backend is stored beside the identity, not
inside it, so that a report from backend X can be compared with a baseline taken on backend Y
(see :func:`identity`). Entries are written one per line, sorted, with no timestamps: refreshing
a baseline from an unchanged run rewrites the same bytes, and a review diff shows exactly the
instances whose recorded outcome changed.
"""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import quote
from ..model import BAD_OUTCOMES, OUTCOMES
from ..report.jsonfile import UnreadableFile, printable, read_json
from ..report.oneline import cause_of, one_line
from ..report.records import write_atomic

BASELINE_VERSION = 1
Level = Literal["fail", "warn", "ok"]
LEVELS: tuple[Level, ...] = ("fail", "warn", "ok")

# What each kind of change does to the gate's exit status, unless the baseline file or the
# command line says otherwise. Regressions, failures nobody has seen before and instances the
# baseline has but the report lacks fail (a vanished instance is not a pass; a deliberately
# partial run sets missing to warn); newly skipped instances and fixes to lock in warn.
CATEGORIES: tuple[str, ...] = ("regression", "new_failure", "missing", "newly_skipped", "fixed",
                               "new", "changed", "unchanged")
# Session-level keys: ``incomplete`` is a report whose session did not give every collected
# instance a result (Ctrl-C, SIGTERM, -x, --maxfail, a crash); it fails unless allowed.
SESSION_KEYS: tuple[str, ...] = ("incomplete",)
POLICY_KEYS: tuple[str, ...] = (*CATEGORIES, *SESSION_KEYS)
DEFAULT_POLICY: dict[str, Level] = {
    "regression": "fail", "new_failure": "fail", "missing": "fail", "newly_skipped": "warn",
    "fixed": "warn", "new": "ok", "changed": "ok", "unchanged": "ok", "incomplete": "fail",
}
REFRESH_HINT = ("pytest cases/ --backend gloo && "
                "collective-gate reports/conformance.json ci/baselines/gloo-cpu.json --update")


def refresh_hint(baseline_path: str, report_path: str = "reports/conformance.json",
                 run: str = "") -> str:
    """How to (re)create *this* baseline: the gate's ``--update`` on the paths in use, after
    ``run`` (the pytest command that writes the report) when it is known. Never the bundled
    suite's paths for a user's own baseline: following the hint must not overwrite them."""
    cmd = (f"collective-gate {shlex.quote(report_path)} {shlex.quote(baseline_path)} "
           "--update")
    return f"{run} && {cmd}" if run else f"{cmd} (after the pytest run that writes the report)"


class BaselineError(Exception):
    """A baseline or report file cannot be used; the message says which file and what to do."""


@dataclass(frozen=True)
class Entry:
    """One instance as the gate sees it, from a report record or a baseline entry."""

    key: str  # file::case[id], for display (the id includes the backend)
    case: str  # file::case
    backend: str
    axes: dict[str, Any]
    outcome: str
    reason: str = ""  # one line: why it is not simply passing
    where: str = ""  # file:line of the case, when known (reports only)
    allow: tuple[str, ...] = ()  # extra outcomes the baseline accepts for this instance
    note: str = ""  # a person's note kept across refreshes
    cause: str = ""  # the failure's cause key (reports only; harness.gate.causes)

    def identity(self, with_backend: bool) -> tuple[str, str, str]:
        """The matching key: case id and axes, plus the backend unless comparing across them."""
        return (self.backend if with_backend else "", self.case, canonical(self.axes))


def canonical(axes: dict[str, Any]) -> str:
    """Axes as a canonical string (sorted keys, no whitespace) so equal axes compare equal."""
    return json.dumps(axes, sort_keys=True, separators=(",", ":"))


def entries_from_report(report: dict[str, Any]) -> list[Entry]:
    """Every record of a report as an :class:`Entry`."""
    out: list[Entry] = []
    for r in report["records"]:
        reason = "" if r["outcome"] == "passed" else one_line(r)
        out.append(Entry(key=r["key"], case=f"{r['file']}::{r['case']}", backend=r["backend"],
                         axes=dict(r["axes"]), outcome=r["outcome"], reason=reason,
                         where=f"{r['file']}:{r['line']}",
                         cause=cause_of(r, reason) if r["outcome"] in BAD_OUTCOMES else ""))
    return out


@dataclass
class Baseline:
    """A loaded baseline: its entries, the policy it carries and where it came from."""

    entries: list[Entry]
    policy: dict[str, Level] = field(default_factory=lambda: dict(DEFAULT_POLICY))
    torch: str = ""
    path: str = ""
    nccl: str = ""  # the NCCL version the report recorded (NCCL runs only)
    # How to refresh this file, as written into its comment: the command that wrote it.
    refresh: str = ""

    @property
    def backends(self) -> list[str]:
        return sorted({e.backend for e in self.entries})


def _bad(path: str, what: str, hint: str) -> BaselineError:
    return BaselineError(f"{path}: {what}; regenerate it with: {hint}")


def parse_policy(items: dict[str, Any], where: str) -> dict[str, Level]:
    """Validate a category -> level mapping (from a baseline file or ``--policy``)."""
    out: dict[str, Level] = {}
    for cat, level in items.items():
        if cat not in POLICY_KEYS:
            raise BaselineError(f"{where}: unknown gate category {quote(cat, 60)}; "
                                f"choose from {', '.join(POLICY_KEYS)}")
        if level not in LEVELS:
            raise BaselineError(f"{where}: policy for {quote(cat, 60)} must be one of "
                                f"{', '.join(LEVELS)}, got {quote(level, 60)}")
        out[cat] = level
    return out


def load(path: str, hint: str = "") -> Baseline:
    """Read a baseline file, with a one-line error a person can act on if it is malformed.

    ``hint``: the command that (re)creates it, shown when it is missing or malformed (default:
    :func:`refresh_hint` for ``path``)."""
    hint = hint or refresh_hint(path)
    try:
        doc = read_json(path, "baseline file", f" (create it with: {hint})")
    except UnreadableFile as exc:
        text = str(exc) if hint in str(exc) else f"{exc}; regenerate it with: {hint}"
        raise BaselineError(text) from None
    if not isinstance(doc, dict) or doc.get("baseline_version") != BASELINE_VERSION:
        raise _bad(path, f"not a collective-harness baseline (expected \"baseline_version\": "
                         f"{BASELINE_VERSION})", hint)
    policy = dict(DEFAULT_POLICY)
    raw_policy = doc.get("policy", {})
    if not isinstance(raw_policy, dict):
        raise _bad(path, "\"policy\" must be an object of category: level", hint)
    policy.update(parse_policy(raw_policy, f"{path}: policy"))
    raw_entries = doc.get("entries", [])
    if not isinstance(raw_entries, list):
        raise _bad(path, "\"entries\" must be a list", hint)
    entries = [_entry(path, n, e, hint) for n, e in enumerate(raw_entries)]
    for name in ("torch", "nccl_version"):
        if not isinstance(doc.get(name, ""), str):
            raise _bad(path, f"{name!r} must be a string", hint)
    return Baseline(entries, policy, doc.get("torch", ""), path, doc.get("nccl_version", ""))


def _entry(path: str, n: int, e: Any, hint: str) -> Entry:
    """Entry ``n`` of a baseline file, every field checked for its type."""
    if not isinstance(e, dict):
        raise _bad(path, f"entries[{n}] is malformed (not an object)", hint)
    for name in ("key", "case", "backend", "outcome"):
        if not isinstance(e.get(name), str):
            raise _bad(path, f"entries[{n}] is malformed (missing or wrong field {name!r}: "
                             "a string)", hint)
    for name in ("reason", "note"):
        if not isinstance(e.get(name, ""), str):
            raise _bad(path, f"entries[{n}] is malformed (wrong field {name!r}: a string)",
                       hint)
    if not isinstance(e.get("axes"), dict):
        raise _bad(path, f"entries[{n}] is malformed (missing or wrong field 'axes': an "
                         "object)", hint)
    allow = e.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(o, str) for o in allow):
        raise _bad(path, f"entries[{n}] is malformed (wrong field 'allow': a list of "
                         "outcomes)", hint)
    unknown = [o for o in (e["outcome"], *allow) if o not in OUTCOMES]
    if unknown:
        raise _bad(path, f"entries[{n}] ({printable(e['key'], 120)}): unknown outcome "
                         f"{printable(repr(unknown[0]), 60)}; outcomes are "
                         f"{', '.join(OUTCOMES)}", hint)
    return Entry(key=e["key"], case=e["case"], backend=e["backend"], axes=dict(e["axes"]),
                 outcome=e["outcome"], reason=e.get("reason", ""), allow=tuple(allow),
                 note=e.get("note", ""))


def from_report(report: dict[str, Any], previous: Baseline | None = None,
                keep: list[Entry] | None = None) -> Baseline:
    """A baseline recording every instance of ``report``. A person's ``allow`` and ``note`` on
    an entry of ``previous`` carry over; ``keep`` adds entries the report did not run."""
    old = {e.identity(True): e for e in previous.entries} if previous else {}
    entries: list[Entry] = []
    for e in [*entries_from_report(report), *(keep or [])]:
        prior = old.get(e.identity(True))
        if prior is not None:
            e = Entry(e.key, e.case, e.backend, e.axes, e.outcome, e.reason, "", prior.allow,
                      prior.note)
        entries.append(e)
    policy = previous.policy if previous else dict(DEFAULT_POLICY)
    meta = report["metadata"]
    return Baseline(entries, policy, str(meta.get("torch", "")),
                    nccl=str(meta.get("nccl_version") or ""))


def render(baseline: Baseline) -> str:
    """The baseline as JSON text: a readable header, then one entry per line, sorted."""
    entries = sorted(baseline.entries, key=lambda e: (e.backend, e.key, canonical(e.axes)))
    counts = Counter(e.outcome for e in entries)
    head: dict[str, Any] = {
        "baseline_version": BASELINE_VERSION,
        "comment": "collective-harness gate baseline: one entry per instance, keyed by case id "
                   "+ axes (+ backend). Refresh: " + (baseline.refresh or
                                                     "run the suite that made it, then "
                                                     "collective-gate REPORT THIS-FILE --update")
                   + " (docs/howto/ci-gate.md)",
        "backends": sorted({e.backend for e in entries}),
        "torch": baseline.torch,
        **({"nccl_version": baseline.nccl} if baseline.nccl else {}),
        "counts": {o: counts[o] for o in OUTCOMES if counts[o]},
        "policy": {c: baseline.policy[c] for c in POLICY_KEYS if c in baseline.policy},
    }
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
    lines.append(' "entries": [')
    rows = []
    for e in entries:
        row: dict[str, Any] = {"key": e.key, "case": e.case, "backend": e.backend,
                               "axes": dict(sorted(e.axes.items())), "outcome": e.outcome}
        if e.reason:
            row["reason"] = e.reason
        if e.allow:
            row["allow"] = list(e.allow)
        if e.note:
            row["note"] = e.note
        rows.append("  " + json.dumps(row, ensure_ascii=False, separators=(", ", ": ")))
    lines.append(",\n".join(rows))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write(path: str, baseline: Baseline) -> None:
    """Write ``baseline`` to ``path`` atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomic(path, render(baseline))
