"""A certificate from reports: every record filed under its cells, each cell judged, the
failures grouped by cause, and the level.

Pure data in, data out (the JSON reports of the identity, library and reference sessions), so
the rules here are tested without running anything.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..model import BAD_OUTCOMES
from ..report.oneline import cause_of, normalise, one_line
from ..run.pool import START_FAILED
from ..run.ranklog import EARLIER

BLOCKED = "blocked: "  # harness.runner.breaker's skip prefix
UNSTARTED = "blocked: pool start: "  # harness.runner.starts's: its process group never started
# Per record, then per cell the worst of its records: the order is the order of severity.
STATUSES = ("broken promise", "not rejected", "blocked", "own divergence",
            "inherited divergence", "shared limitation", "unsupported as declared",
            "conforming", "skipped")
BROKEN = ("broken promise", "not rejected", "blocked")
LEVELS = ("none", "declared", "conforming")  # weakest first
DEFAULT_SKIP_BUDGET = 0.05


def status(record: dict[str, Any]) -> str:
    """What one record says about the backend, in the certificate's words."""
    outcome = record["outcome"]
    declared_gap = bool(record.get("unsupported"))
    if outcome in (*BAD_OUTCOMES, "xpass"):
        return "not rejected" if declared_gap else "broken promise"
    if outcome == "skipped":
        if str(record.get("reason", "")).startswith(BLOCKED):
            return "blocked"
        return "unsupported as declared" if declared_gap else "skipped"
    if declared_gap:
        return "unsupported as declared"
    if outcome == "uncheckable":
        # The case's expected value is inexact at this dtype and world size and it states no
        # bound: a property of the case, the same on every backend.
        return "shared limitation"
    if outcome in ("limitation", "xfail"):
        # Overrides naming no backend state what torch does everywhere: shared by every
        # backend, not this one's divergence; of the rest, all from the wrapped backend is
        # inherited, any of its own makes it its own.
        scoped = [o for o in record.get("overrides_applied", []) if not o.get("every_backend")]
        if not scoped and record.get("overrides_applied"):
            return "shared limitation"
        if scoped and all(o.get("inherited") for o in scoped):
            return "inherited divergence"
        return "own divergence"
    return "conforming"


def cells_of(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The (op, dtype, capability) cells a record belongs to: each op it issues, its dtype,
    each capability it uses ("-" when it uses none beyond the op and dtype)."""
    needs = [n.split(" ", 1) for n in record.get("needs", [])]
    ops = [i for c, i in needs if c == "op"] or [record.get("op", "?")]
    caps = [i for c, i in needs if c == "capability"] or ["-"]
    dtype = str(record.get("dtype", "?"))
    return [(op, dtype, cap) for op in ops for cap in caps]


@dataclass
class Cell:
    """One op x dtype x capability cell: its worst status, and how many records of each."""

    op: str
    dtype: str
    capability: str
    counts: Counter[str] = field(default_factory=Counter)
    example: str = ""  # the key of a record with the cell's status

    @property
    def status(self) -> str:
        """The worst status among its records."""
        return next(s for s in STATUSES if self.counts.get(s))


def build_cells(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], Cell]:
    """Every cell of ``records``."""
    cells: dict[tuple[str, str, str], Cell] = {}
    for rec in records:
        st = status(rec)
        for key in cells_of(rec):
            cell = cells.setdefault(key, Cell(*key))
            cell.counts[st] += 1
            if cell.status == st:
                cell.example = rec["key"]
    return cells


def cause(record: dict[str, Any]) -> str:
    """What a failed record failed on, with its particulars (numbers, paths) taken out, so
    that hundreds of results of one root cause read as one line: the gate's cause key, with
    the outcome and the case in front where no rank raised (a wrong value of broadcast and one
    of all_reduce are different causes; one exception text is one cause, whatever the case,
    and so is one process group that could not start: the same pool serves every case)."""
    text = one_line(record)
    at = text.find(START_FAILED)
    reason = (f"{record['outcome']}: {text[at:]}" if at >= 0
              else f"{record['outcome']}: {record.get('case', '?')}: {text}")
    said = printed_error(record) if record["outcome"] == "hang" else ""
    return cause_of(record, f"{reason}; a blocked rank printed {said}" if said else reason)


# The line of a traceback that names the exception ("KeyError: 2", "torch.x.DistError: ...").
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)(: .*)?$")


def printed_error(record: dict[str, Any]) -> str:
    """The last exception a blocked rank of a hung record printed during the instance (a
    backend's thread that died: torchft's future handler's ``KeyError``), or ""; output from
    before the instance does not count."""
    for rank in record.get("ranks") or []:
        if not isinstance(rank, dict) or rank.get("state") != "blocked":
            continue
        tail = str(rank.get("stderr_tail") or "")
        if EARLIER in tail:
            tail = tail.split(EARLIER, 1)[1]
        for line in reversed(tail.splitlines()):
            if _EXCEPTION_LINE.match(line.strip()):
                return line.strip()
    return ""


def causes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failures grouped by cause, largest first, each with its count and a few examples."""
    return _largest_first("cause", [(cause(rec), rec["key"]) for rec in records
                                    if status(rec) in ("broken promise", "not rejected")])


def _largest_first(label: str, keyed: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """(group, record key) pairs as groups, largest first, each with its count and a few
    examples; ``label`` names the group's field."""
    groups: dict[str, list[str]] = defaultdict(list)
    for group, key in keyed:
        groups[group].append(key)
    return [{label: g, "count": len(keys), "examples": keys[:3]}
            for g, keys in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


# A report written before records said why a pool was replaced.
UNRECORDED = "why not recorded (a report from before the field existed)"


def replacements(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pools not kept after their instance, grouped by why (particulars taken out), largest
    first. Each instance's verdict can be right while this is not: a backend whose group is
    unusable after any error shows here as one health-check failure per rejected call, each
    paid for with a new group, and a certificate that hid it would say less than was seen."""
    return _largest_first("why", [(normalise(str(rec.get("pool_replaced_why") or UNRECORDED)),
                                   rec["key"]) for rec in records if rec.get("pool_replaced")])


def identity_problems(report: dict[str, Any] | None) -> list[str]:
    """One line per identity probe that did not pass, with its evidence (empty when all did);
    a missing or incomplete identity session is a problem too."""
    if report is None:
        return ["the identity probes did not run"]
    out: list[str] = []
    if not report.get("session", {}).get("complete", False):
        out.append("the identity session is incomplete")
    for rec in sorted(report.get("records", []), key=lambda r: (r.get("line", 0), r["key"])):
        if rec["outcome"] != "passed":
            # The evidence is under the message's first line (the probe's place), or that
            # line itself when it is all there is (a process group that did not start).
            lines = str(rec.get("message") or rec.get("reason") or "").splitlines()
            out.append(f"{rec['case']} [{rec['id']}] {rec['outcome']}: "
                       + " | ".join(ln.strip() for ln in lines[1:4] or lines[:1])[:600])
    if not report.get("records"):
        out.append("no identity probe has a result")
    return out


def reference_diff(cells: dict[tuple[str, str, str], Cell],
                   reference: dict[tuple[str, str, str], Cell] | None,
                   inherited_from_reference: bool = False) -> list[dict[str, str]]:
    """Cells whose status differs from the reference backend's same cell. When the backend
    wraps the reference's backend (``inherited_from_reference``), its inherited divergences
    are the reference's own divergences seen from the wrapper (the same overrides), so those
    two statuses are the same status here."""
    if reference is None:
        return []

    def same(mine: str, theirs: str) -> bool:
        return mine == theirs or (inherited_from_reference and mine == "inherited divergence"
                                  and theirs == "own divergence")

    out = []
    for key, cell in sorted(cells.items()):
        ref = reference.get(key)
        if ref is not None and not same(cell.status, ref.status):
            out.append({"op": key[0], "dtype": key[1], "capability": key[2],
                        "backend": cell.status, "reference": ref.status})
    return out


def skip_share(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(records skipped for a reason other than a declaration or a hang, all records). An
    instance whose process group never started is counted too (it is blocked as well): an
    unstarted group is a skip the budget refuses, whatever passed."""
    skipped = sum(1 for r in records if status(r) == "skipped" or (
        r["outcome"] == "skipped" and str(r.get("reason", "")).startswith(UNSTARTED)))
    return skipped, len(records)


def level(*, identity: list[str], complete: bool, cells: dict[Any, Cell],
          skipped: int, total: int, budget: float) -> tuple[str, list[str]]:
    """The certificate's level and why it is not higher (one line per reason)."""
    why: list[str] = []
    if identity:
        why.append("identity: " + identity[0])
    if not complete:
        why.append("the library session is incomplete")
    if total == 0:
        why.append("no instance of the library has a result")
    if total and skipped / total > budget:
        why.append(f"{skipped} of {total} instances skipped ({skipped / total:.1%}), over the "
                   f"skip budget of {budget:.1%}")
    broken = Counter(c.status for c in cells.values() if c.status in BROKEN)
    for st, n in sorted(broken.items()):
        why.append(f"{n} cell(s) {st}")
    if why:
        return "none", why
    own = sum(1 for c in cells.values() if c.status == "own divergence")
    if own:
        return "declared", [f"{own} cell(s) with the backend's own declared divergences"]
    return "conforming", []


def certificate(identity: dict[str, Any] | None, library: dict[str, Any],
                reference: dict[str, Any] | None, budget: float = DEFAULT_SKIP_BUDGET,
                proposed: bool = False) -> dict[str, Any]:
    """The certificate of one backend: level, reasons, identity, cells, causes, the
    difference from the reference."""
    records = library.get("records", [])
    cells = build_cells(records)
    ref_cells = build_cells(reference.get("records", [])) if reference else None
    skipped, total = skip_share(records)
    id_problems = identity_problems(identity)
    complete = bool(library.get("session", {}).get("complete", False))
    lvl, why = level(identity=id_problems, complete=complete, cells=cells, skipped=skipped,
                     total=total, budget=budget)
    if proposed:  # a manifest written from what passed would certify anything that runs
        lvl, why = "none", [*why, "the manifest was proposed by probes, not declared"]
    meta = library.get("metadata", {})
    manifest = meta.get("options", {}).get("manifest")
    ref_backend = (reference or {}).get("metadata", {}).get("options", {}).get("backend")
    statuses = Counter(status(r) for r in records)
    return {
        "certificate_version": 1,
        "backend": meta.get("options", {}).get("backend", "?"),
        "manifest": manifest,
        "manifest_proposed": proposed,
        "torch": meta.get("torch", ""),
        "level": lvl,
        "why": why,
        "identity": {"ok": not id_problems, "problems": id_problems},
        "skip_budget": budget,
        "skipped": skipped,
        "instances": total,
        "statuses": {s: statuses.get(s, 0) for s in STATUSES},
        "cells": [{"op": c.op, "dtype": c.dtype, "capability": c.capability,
                   "status": c.status, "counts": dict(c.counts), "example": c.example}
                  for _, c in sorted(cells.items())],
        "causes": causes(records),
        "pools_replaced": replacements(records),
        "reference": {"backend": ref_backend,
                      "differs": reference_diff(cells, ref_cells, bool(ref_backend) and (
                          (manifest or {}).get("inherits") == ref_backend))}
        if reference else None,
        "headline": library.get("summary", {}).get("headline", ""),
    }


def meets(cert: dict[str, Any], required: str) -> bool:
    """Whether the certificate's level is at least ``required``."""
    return LEVELS.index(str(cert.get("level", "none"))) >= LEVELS.index(required)
