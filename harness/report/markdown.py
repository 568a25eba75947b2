"""Markdown conformance matrix: per backend, op x dtype, for humans and $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ..model import UNEXPECTED_OUTCOMES
from ..verdict import deaths
from . import errors_table, headline, ordering_table, perf_md
from .mdtext import code, escape

SYMBOLS = {"passed": "✅", "failed": "❌", "error": "💥", "hang": "⏳", "crash": "☠️",
           "xfail": "⚠️", "xpass": "❗", "skipped": "⏭️", "limitation": "🚫",
           "uncheckable": "❔"}
# A documented limitation (the backend rejected, crashed or hung as declared) is its own
# outcome, so the matrix shows what a backend cannot do apart from what it does right.
CELL_SYMBOLS = SYMBOLS
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


def fresh_rerun(record: dict[str, Any]) -> str:
    """What running a failure again on fresh ranks showed ("" when it was not run again)."""
    again = record.get("fresh_rerun")
    if not isinstance(again, dict):
        return ""
    after = code(str(again.get("after", "")))
    if again.get("state_carried"):
        return (f"<br>failed only after {after} on the same ranks; passes on fresh ranks: "
                "state carried between instances")
    return (f"<br>run again on fresh ranks (after {after} failed or raised on the same "
            f"ranks): {escape(str(again.get('fresh', '')))} there too")


def cell(outcomes: Counter[str]) -> str:
    """``✅ 12 ❌ 1``: one symbol and count per outcome present, worst first."""
    order = ("failed", "error", "hang", "crash", "xpass", "xfail", "uncheckable", "limitation",
             "passed", "skipped")
    return " ".join(f"{CELL_SYMBOLS[o]}{NBSP}{outcomes[o]}" for o in order if outcomes.get(o))


def cell_outcome(record: dict[str, Any]) -> str:
    """The record's outcome (reports written before ``limitation`` was an outcome counted a
    declared failure mode as passed: shown as a limitation too)."""
    if (record["outcome"] == "passed" and record.get("expected", "pass") != "pass"
            and record.get("reason")):
        return "limitation"
    return str(record["outcome"])


def verdict_line(summary: dict[str, Any], session: dict[str, Any] | None = None) -> str:
    """``**Verdict: PASS** — 2,030 instances: 1,441 conformant, ...; nothing unexpected``."""
    word, _, rest = headline.headline(summary, session).partition(": ")
    return f"**Verdict: {word}** — {rest}"


def session_notice(report: dict[str, Any]) -> list[str]:
    """What the reader must know before any count: an incomplete session."""
    out: list[str] = []
    session = report.get("session")
    if isinstance(session, dict) and not session.get("complete", True):
        out += [f"> **⛔ INCOMPLETE SESSION**: {headline.incomplete_text(session)}. The counts "
                "below cover only what ran; this report is not a verdict on the backend.", ""]
    return out


def not_applied_notice(report: dict[str, Any]) -> list[str]:
    """Overrides that did not apply because of their torch/backend scope: a count, and the
    ones that bear on this run listed (after the verdict: a long list must not push it down
    the page). One bears on the run where an instance it would have covered did not do what
    was expected: judged without the override, a divergence it documents elsewhere can be
    this failure. The others (the library's overrides for other torch versions and backends,
    usually dozens) are in the JSON and HTML reports."""
    out: list[str] = []
    scoped = report.get("summary", {}).get("overrides_not_applied") or []
    if not scoped:
        return out
    parts = []
    for scope, label in (("torch", "the torch version"), ("nccl", "the NCCL version"),
                         ("backend", "the backend")):
        these = [o for o in scoped if o["scope"] == scope]
        if these:
            parts.append(f"{len(these)} because of {label} ("
                         f"{sum(o['instances'] for o in these)} instance(s))")
    bearing = {(r.get("file"), o.get("line"), o.get("scope"))
               for r in report.get("records", ()) if r.get("outcome") in UNEXPECTED_OUTCOMES
               for o in r.get("overrides_not_applied", ())}
    shown = [o for o in scoped if (o["file"], o["line"], o["scope"]) in bearing]
    torch_note = (" Instances whose override is scoped to another torch version are judged "
                  "without it: a documented divergence can show up as a failure."
                  if any(o["scope"] in ("torch", "nccl") for o in scoped) else "")
    rest = len(scoped) - len(shown)
    where = ("" if not rest else f" {'The' if not shown else 'The other'} {rest} cover no "
             "instance with an unexpected outcome here: listed in the JSON report "
             "(`summary.overrides_not_applied`) and the HTML report.")
    out += ["> **Overrides not applied** because of their scope: " + "; ".join(parts) + "."
            + torch_note + where, ""]
    if shown:
        out += [f"<details><summary>The {len(shown)} that cover an instance with an "
                "unexpected outcome here</summary>", ""]
        for o in sorted(shown, key=lambda o: (o["scope"] != "torch", o["file"], o["line"])):
            cases = ", ".join(f"`{c}`" for c in o["cases"][:20])
            more = f" and {len(o['cases']) - 20} more" if len(o["cases"]) > 20 else ""
            out.append(f"- `{o['file']}:{o['line']}` ({o['when']}; {o['instances']} "
                       f"instance(s)): {o['reason']} — cases {cases}{more}")
        out += ["", "</details>", ""]
    return out


def filed_under(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(op, family) of every grid row a record belongs to: each op a multi-op program issues
    (an FSDP round trip is an all_gather and a reduce_scatter), else its one op."""
    issued = record.get("issued")
    if isinstance(issued, list) and issued:
        return [(e["op"], e["family"]) for e in issued]
    return [(record["op"], record.get("family") or record["op"])]


def matrix(records: list[dict[str, Any]]) -> list[str]:
    """Markdown table lines: rows are ops, columns dtypes. A multi-op program is counted in
    the row of every op it issues; the headline counts it once."""
    dtypes = sorted({r["dtype"] for r in records})
    by_cell: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in records:
        for op, _ in filed_under(r):
            by_cell[(op, r["dtype"])][cell_outcome(r)] += 1
    ops = sorted({op for r in records for op, _ in filed_under(r)})
    # op and dtype names come from the harness's own tables (validated at collection)
    lines = ["| op | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for op in ops:
        lines.append(f"| {op} | " + " | ".join(cell(by_cell.get((op, d), Counter()))
                                               for d in dtypes) + " |")
    multi = sum(1 for r in records if r.get("issued"))
    if multi:
        lines += ["", f"{multi} program instance(s) issue several ops and are counted in the "
                  "row of each; the headline counts every instance once."]
    return lines


def render(report: dict[str, Any]) -> str:
    """The whole Markdown report."""
    meta = report["metadata"]
    out: list[str] = session_notice(report)
    session = report.get("session")
    for backend in meta["backends"] or ["(none)"]:
        recs = [r for r in report["records"] if r["backend"] == backend]
        counts = Counter(cell_outcome(r) for r in recs)
        summary = {**{k: counts.get(k, 0) for k in SYMBOLS}, "total": len(recs)}
        out.append(f"# Conformance: {escape(backend)} on {escape(devices_label(recs))} "
                   f"(torch {escape(meta['torch'])})")
        out.append("")
        out.append(verdict_line(summary, session if isinstance(session, dict) else None))
        out.append("")
        detected = deaths.detection_line(recs)
        if detected:  # programs through a failure: how soon the survivors saw a death
            out += [escape(detected[0].upper() + detected[1:]) + ".", ""]
        if backend == (meta["backends"] or ["(none)"])[0]:
            out.extend(not_applied_notice(report))
        out.append(f"World sizes: {', '.join(map(str, sorted({r['world_size'] for r in recs})))}"
                   f" · host {escape(meta.get('hostname', '?'))} · "
                   f"{escape(meta.get('created', ''))}")
        out.append("")
        out.append("Legend: " + " ".join(f"{s}{NBSP}{o}" for o, s in SYMBOLS.items()
                                         if o not in ("limitation", "uncheckable"))
                   + f" 🚫{NBSP}limitation (rejected, crashed, hung or computed what an "
                     f"override declares; not a pass) ❔{NBSP}uncheckable (the expected value "
                     "is inexact; not a pass)")
        out.append("")
        out.extend(matrix(recs))
        out.append("")
        out.extend(ordering_table.render(recs))
        out.extend(errors_table.markdown(recs))
        bad = [r for r in recs if r["outcome"] in UNEXPECTED_OUTCOMES]
        if bad:
            out.append(f"## Failures ({len(bad)})")
            out.append("")
            for r in bad[:MAX_FAILURES]:
                first = r["message"].splitlines()[0] if r["message"] else ""
                wrong = first_wrong(r)
                out.append(f"- **{escape(r['outcome'])}** {code(r['key'])} — {escape(first)}"
                           + (f"<br>first wrong: {code(wrong)}" if wrong else "")
                           + fresh_rerun(r))
            if len(bad) > MAX_FAILURES:
                out.append(f"- … and {len(bad) - MAX_FAILURES} more (see the JSON report)")
            out.append("")
        known = sorted({(r["op"], r["reason"]) for r in recs
                        if cell_outcome(r) in ("xfail", "limitation") and r["reason"]})
        if known:
            out.append("## Documented divergences and limitations")
            out.append("")
            for op, reason in known:
                out.append(f"- {code(op)}: {escape(reason)}")
            out.append("")
        skipped = Counter(r["reason"] or r["message"] for r in recs if r["outcome"] == "skipped")
        if skipped:
            out.append("## Skipped")
            out.append("")
            for reason, n in skipped.most_common():
                out.append(f"- {n} x {escape(reason)}")
            out.append("")
    return ("\n".join(out) + perf_md.render(report)).rstrip() + "\n"
