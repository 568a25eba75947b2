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
    text = " ".join(f"{SYMBOLS[s]} {statuses[s]}" for s in SYMBOLS if statuses.get(s))
    return text or "-"


def _observed(values: Counter[str]) -> str:
    text = ", ".join(f"{OBSERVED[v]} x{n}" for v, n in values.most_common() if v in OBSERVED)
    return text or "-"


def render(records: list[dict[str, Any]]) -> list[str]:
    """Markdown lines for one backend's records (nothing when no record has ordering)."""
    recs = [r for r in records if r.get("ordering")]
    if not recs:
        return []
    by_op: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    observed: dict[str, Counter[str]] = defaultdict(Counter)
    for r in recs:
        cells = by_op[r["op"]]
        cells["instances"]["n"] += 1
        for key, _ in COLUMNS:
            verdict = r["ordering"][key]
            cells[key]["known" if "known" in verdict else verdict["status"]] += 1
        observed[r["op"]][r["ordering"]["host_blocking"].get("observed", "unknown")] += 1
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
        lines.append(f"| {op} | {cells['instances']['n']} | "
                     + " | ".join(_cell(cells[key]) for key, _ in COLUMNS)
                     + f" | {_observed(observed[op])} |")
    lines.append("")
    known = sorted({(r["op"], key, r["ordering"][key]["known"]) for r in recs
                    for key, _ in COLUMNS if "known" in r["ordering"][key]})
    if known:
        lines += ["Documented ordering divergences (overrides):", ""]
        lines += [f"- {code(op)} {key.replace('_', '-')}: {escape(reason)}"
                  for op, key, reason in known]
        lines.append("")
    return lines
