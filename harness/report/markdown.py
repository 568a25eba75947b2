"""Markdown conformance matrix: per backend, op x dtype, for humans and $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from . import ordering_table

SYMBOLS = {"passed": "✅", "failed": "❌", "error": "💥", "hang": "⏳", "crash": "☠️",
           "xfail": "⚠️", "xpass": "❗", "skipped": "⏭️"}
# Matrix cells also tell a documented limitation (the backend rejected, crashed or hung as
# the case declares) apart from a plain pass, so the matrix shows what a backend cannot do.
CELL_SYMBOLS = {**SYMBOLS, "limitation": "🚫"}
BAD = ("failed", "error", "hang", "crash")
MAX_FAILURES = 50
# Between a symbol and its count: a no-break space, so GitHub never wraps "✅" and "12" onto
# different lines of a narrow table cell (groups are separated by ordinary spaces).
NBSP = "\u00a0"


def devices_label(records: list[dict[str, Any]]) -> str:
    """The devices that ran instances (``cpu``); a device whose every instance was skipped is
    named apart (``cpu (cuda: 12 skipped, none ran)``), never as if it had run."""
    ran = sorted({r["device"] for r in records if r["outcome"] != "skipped"})
    skipped_only = Counter(r["device"] for r in records if r["device"] not in ran)
    text = ", ".join(ran) or "no device"
    if skipped_only:
        text += " (" + "; ".join(f"{d}: {n} skipped, none ran"
                                 for d, n in sorted(skipped_only.items())) + ")"
    return text


def first_wrong(record: dict[str, Any]) -> str:
    """The first wrong element of a failed record: ``rank 1 'output'[3]: expected 4 got 6``
    (empty when no check recorded one)."""
    for rk in record.get("ranks", []):
        for c in rk.get("checks", []):
            if c.get("ok") is False and c.get("first_wrong"):
                fw = c["first_wrong"][0]
                return (f"rank {rk['rank']} {c['tensor']!r}[{fw['index']}]: expected "
                        f"{fw['expected']} got {fw['got']} ({c['wrong']} of {c['total']} "
                        "wrong)")
            if c.get("ok") is False and c.get("note"):
                return f"rank {rk['rank']} {c['tensor']!r}: {c['note']}"
    return ""


def cell(outcomes: Counter[str]) -> str:
    """``✅ 12 ❌ 1``: one symbol and count per outcome present, worst first."""
    order = ("failed", "error", "hang", "crash", "xpass", "xfail", "limitation", "passed",
             "skipped")
    return " ".join(f"{CELL_SYMBOLS[o]}{NBSP}{outcomes[o]}" for o in order if outcomes.get(o))


def cell_outcome(record: dict[str, Any]) -> str:
    """The record's outcome, with passes of a declared failure mode counted as limitations."""
    if record["outcome"] == "passed" and record.get("expected", "pass") != "pass":
        return "limitation"
    return str(record["outcome"])


def verdict_line(summary: dict[str, Any]) -> str:
    bad = sum(summary.get(o, 0) for o in BAD)
    word = "PASS" if bad == 0 else "FAIL"
    parts = [f"{summary.get(o, 0)} {o}" for o in
             ("passed", "failed", "error", "hang", "crash", "xfail", "xpass", "skipped")
             if summary.get(o, 0)]
    return f"**Verdict: {word}** ({summary.get('total', 0)} instances: {', '.join(parts)})"


def matrix(records: list[dict[str, Any]]) -> list[str]:
    """Markdown table lines: rows are ops, columns dtypes."""
    dtypes = sorted({r["dtype"] for r in records})
    by_cell: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in records:
        by_cell[(r["op"], r["dtype"])][cell_outcome(r)] += 1
    ops = sorted({r["op"] for r in records})
    lines = ["| op | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for op in ops:
        lines.append(f"| {op} | " + " | ".join(cell(by_cell.get((op, d), Counter()))
                                               for d in dtypes) + " |")
    return lines


def render(report: dict[str, Any]) -> str:
    """The whole Markdown report."""
    meta = report["metadata"]
    out: list[str] = []
    for backend in meta["backends"] or ["(none)"]:
        recs = [r for r in report["records"] if r["backend"] == backend]
        counts = Counter(r["outcome"] for r in recs)
        summary = {**{k: counts.get(k, 0) for k in SYMBOLS}, "total": len(recs)}
        out.append(f"# Conformance: {backend} on {devices_label(recs)} (torch {meta['torch']})")
        out.append("")
        out.append(verdict_line(summary))
        out.append("")
        out.append(f"World sizes: {', '.join(map(str, sorted({r['world_size'] for r in recs})))}"
                   f" · host {meta.get('hostname', '?')} · {meta.get('created', '')}")
        out.append("")
        out.append("Legend: " + " ".join(f"{s}{NBSP}{o}" for o, s in SYMBOLS.items())
                   + f" 🚫{NBSP}limitation (rejected, crashed or hung as the case declares)")
        out.append("")
        out.extend(matrix(recs))
        out.append("")
        out.extend(ordering_table.render(recs))
        bad = [r for r in recs if r["outcome"] in BAD or r["outcome"] == "xpass"]
        if bad:
            out.append(f"## Failures ({len(bad)})")
            out.append("")
            for r in bad[:MAX_FAILURES]:
                first = r["message"].splitlines()[0] if r["message"] else ""
                wrong = first_wrong(r)
                out.append(f"- **{r['outcome']}** `{r['key']}` — {first}"
                           + (f"<br>first wrong: `{wrong}`" if wrong else ""))
            if len(bad) > MAX_FAILURES:
                out.append(f"- … and {len(bad) - MAX_FAILURES} more (see the JSON report)")
            out.append("")
        known = sorted({(r["op"], r["reason"]) for r in recs
                        if (r["reason"] and r["outcome"] in ("xfail", "passed")
                        and r["expected"] != "pass") or r["outcome"] == "xfail"})
        if known:
            out.append("## Documented divergences and limitations")
            out.append("")
            for op, reason in known:
                out.append(f"- `{op}`: {reason}")
            out.append("")
        skipped = Counter(r["reason"] or r["message"] for r in recs if r["outcome"] == "skipped")
        if skipped:
            out.append("## Skipped")
            out.append("")
            for reason, n in skipped.most_common():
                out.append(f"- {n} x {reason}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"
