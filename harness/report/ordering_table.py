"""The "Async contract" table of the Markdown report: ordering verdicts per op, per backend."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from .mdtext import code, escape

COLUMNS = (("pre_op", "pre-op"), ("post_wait", "post-wait"), ("completion", "completion"),
           ("host_blocking", "host blocking"), ("declared", "declared reads"))
SYMBOLS = {"violated": "❌", "known": "⚠️", "inconclusive": "❔", "ok": "✅"}
OBSERVED = {"blocks": "blocks", "returns_early": "returns early", "mixed": "mixed"}


def _cell(statuses: Counter[str]) -> str:
    text = " ".join(f"{SYMBOLS[s]}\u00a0{statuses[s]}" for s in SYMBOLS if statuses.get(s))
    return text or "-"


def status(verdict: dict[str, Any]) -> str:
    """A check's status as the reports show it: "known" for a violation an override
    documents, else the verdict's own status."""
    return "known" if "known" in verdict else str(verdict["status"])


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Counter[str]]]:
    """Per op: ``instances`` ({"n": count}), each check's status counts, and ``observed``
    (blocking forms). Empty when no record has ordering data."""
    by_op: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for r in records:
        if not r.get("ordering"):
            continue
        cells = by_op[r["op"]]
        cells["instances"]["n"] += 1
        for key, _ in COLUMNS:
            cells[key][status(r["ordering"][key])] += 1
        observed = r["ordering"]["host_blocking"].get("observed", "unknown")
        if observed in OBSERVED:
            cells["observed"][OBSERVED[observed]] += 1
    return by_op


def documented(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(op, check, reason) of every ordering divergence an override documents."""
    return sorted({(r["op"], key, r["ordering"][key]["known"]) for r in records
                   if r.get("ordering") for key, _ in COLUMNS if "known" in r["ordering"][key]})


def render(records: list[dict[str, Any]]) -> list[str]:
    """Markdown lines for one backend's records (nothing when no record has ordering)."""
    recs = [r for r in records if r.get("ordering")]
    if not recs:
        return []
    by_op = summarize(recs)
    delays = sorted({r["ordering"]["delay_s"] for r in recs if r["ordering"].get("probes")})
    lines = ["## Async contract", "",
             "Ordering checks of async instances and of programs' declared reads: ✅ ok, "
             "❌ violated, ⚠️ violated as documented by an override, ❔ inconclusive (the "
             "values were wrong even without delays), - not "
             "checked. Probes delay one rank by "
             + (", ".join(f"{d:g}" for d in delays) + " s" if delays else "(no probe ran)")
             + "; \"blocking form\" is what the blocking call was observed to do with that "
             "rank delayed.", "",
             "| op | instances | " + " | ".join(t for _, t in COLUMNS) + " | blocking form |",
             "|---|---|" + "---|" * len(COLUMNS) + "---|"]
    for op in sorted(by_op):
        cells = by_op[op]
        obs = ", ".join(f"{v} x{n}" for v, n in cells["observed"].most_common())
        lines.append(f"| {op} | {cells['instances']['n']} | "
                     + " | ".join(_cell(cells[key]) for key, _ in COLUMNS)
                     + f" | {obs or '-'} |")
    lines.append("")
    known = documented(recs)
    if known:
        lines += ["Documented ordering divergences (overrides):", ""]
        lines += [f"- {code(op)} {key.replace('_', '-')}: {escape(reason)}"
                  for op, key, reason in known]
        lines.append("")
    return lines
