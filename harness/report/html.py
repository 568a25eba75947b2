"""HTML conformance report: one self-contained page (inline CSS and a few lines of inline
script, no fetches), so it can be opened from a CI artifact or a file:// URL.

Layout: the run's verdict and headline first (then an incomplete session's banner), then per
backend: a heading naming the devices that really ran, a banner area (the backend's verdict
when there are several, then any extra banners a caller passes), a filter box, a compact op x
dtype grid (one cell per op and dtype, colored by its worst outcome, counts on hover, a click
opens the cell's drill-down; the legend follows the first grid), a per-family summary. Op
names and the dtype headers stay in view while scrolling (sticky); dtypes are grouped floating
/ integer / other. Below: the async-contract table (the same statuses as the Markdown), extra
per-backend sections a caller passes, the failures (each a ``<details>``), the skips, and one
drill-down per cell.

The outcome palette is a table (:data:`OUTCOMES`), worst first; an outcome added to the
records joins the grid, legend and counts by adding one row.

Kept whole: one self-contained page whose CSS classes, element ids and inline script refer to
each other; the Markdown-like helpers it shares with other writers already live apart
(perf_html, mdtext).
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import dtypes
from ..model import UNEXPECTED_OUTCOMES
from . import errors_table, headline, ordering_table
from .markdown import devices_label, filed_under, first_wrong
from .oneline import one_line
from .perf_html import render as perf_section


@dataclass(frozen=True)
class Shade:
    """One row of the outcome palette."""

    name: str
    color: str
    meaning: str


# Worst first: a cell takes the color of its worst outcome. "limitation" is not a record
# outcome: a passed instance whose case expects the backend to reject, crash or hang (a
# documented limitation), shown apart so such a cell does not look green.
OUTCOMES: tuple[Shade, ...] = (
    Shade("crash", "#24292f", "a rank died"),
    Shade("hang", "#fb8500", "no result before the deadline"),
    Shade("error", "#8250df", "a rank raised"),
    Shade("failed", "#cf222e", "wrong values or the wrong failure mode"),
    Shade("xpass", "#e85aad", "passed, but a known failure was declared"),
    Shade("xfail", "#d4a72c", "failed as a documented divergence declares"),
    Shade("uncheckable", "#bf8700", "the expected value is inexact here: not a pass"),
    Shade("limitation", "#0969da",
          "rejected, crashed, hung or computed what an override declares"),
    Shade("passed", "#2da44e", "met the contract"),
    Shade("skipped", "#8c959f", "not run"),
)
SEVERITY = tuple(s.name for s in OUTCOMES)
COLORS = {s.name: s.color for s in OUTCOMES}
# The grid's column groups, by dtype kind (harness.dtypes); unknown names go to "other".
DTYPE_GROUPS = (("floating", ("float", "float8")), ("integer", ("int", "uint")),
                ("other", ("bool", "complex", "object")))
# An extra per-backend section: (backend, its records) -> HTML lines.
Section = Callable[[str, list[dict[str, Any]]], list[str]]


def shown(r: dict[str, Any]) -> str:
    """What the grid shows for a record: its outcome ("limitation" also for reports written
    before it was an outcome, where a declared failure mode counted as passed)."""
    if r["outcome"] == "passed" and r.get("expected", "pass") != "pass" and r.get("reason"):
        return "limitation"
    return str(r["outcome"])


def mode(r: dict[str, Any]) -> str:
    """sync / async, or a program's derived axis (async, sync or mixed); "-" without one."""
    if "async" not in r["axes"]:
        return "-"
    axis = r["axes"]["async"]
    if isinstance(axis, str):
        return axis
    return "async" if axis else "sync"


CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 24px 48px;color:#1f2328}
h1{font-size:22px;margin:16px 0 4px}h2{font-size:19px;margin:28px 0 6px;
border-bottom:1px solid #d0d7de}h3{font-size:16px;margin:18px 0 6px}
.meta{color:#57606a;margin:2px 0}.banner{font-weight:600;font-size:16px;padding:6px 10px;
border-radius:6px;display:inline-block;margin:4px 0}.banner.pass{background:#dafbe1}
.banner.fail{background:#ffebe9}.banner.note{background:#fff8c5}
.legend{display:flex;flex-wrap:wrap;gap:4px 18px;margin:6px 0}
.legend .item{display:inline-flex;align-items:center;gap:5px;white-space:nowrap}
.sw{display:inline-block;width:14px;height:14px;border-radius:3px}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #d0d7de;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f6f8fa}
.gridwrap{overflow:auto;max-height:85vh;max-width:100%;border:1px solid #d0d7de;
display:inline-block}
table.grid{margin:0;border-collapse:separate;border-spacing:0}
table.grid th,table.grid td{border:0;border-right:1px solid #fff;border-bottom:1px solid #fff}
table.grid thead th{position:sticky;background:#f6f8fa;z-index:2;text-align:center}
table.grid thead tr.groups th{top:0;height:20px;font-weight:600;border-bottom:1px solid #d0d7de}
table.grid thead tr.dtypes th{top:27px;padding:4px 2px;vertical-align:bottom}
table.grid thead th.corner{left:0;z-index:3;text-align:left;vertical-align:bottom}
table.grid .vt{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;
font:12px ui-monospace,monospace;margin:0 auto}
table.grid th.op{position:sticky;left:0;z-index:1;background:#f6f8fa;white-space:nowrap;
font:12px/18px ui-monospace,monospace;font-weight:400}
table.grid tr.fam th{position:sticky;left:0;z-index:1;background:#eaeef2;font-weight:600;
padding:4px 6px}table.grid tr.fam td{background:#eaeef2}
table.grid td{padding:0;min-width:30px;height:22px;text-align:center}
table.grid td.c a{display:block;color:#fff;text-decoration:none;font:11px/22px ui-monospace,
monospace}table.grid td.empty{background:#f6f8fa}
table.grid td.gs{border-left:2px solid #d0d7de}
.bar{display:flex;width:220px;height:12px;border-radius:3px;overflow:hidden;background:#eee}
.bar span{display:block;height:100%}
.filter{margin:8px 0;display:flex;gap:14px;align-items:center;flex-wrap:wrap}
.filter input[type=search]{font:14px system-ui,sans-serif;padding:3px 6px;width:260px}
.badge{display:inline-block;padding:0 5px;border-radius:3px;color:#fff;font-size:12px}
details{margin:3px 0}details>summary{cursor:pointer}details.failure{border-left:4px solid;
padding-left:8px}pre{background:#f6f8fa;padding:6px;overflow:auto;max-height:420px;
white-space:pre-wrap;margin:4px 0}code{font-family:ui-monospace,monospace}
td.st-violated,td.prop-false{background:#ffebe9}td.st-ok,td.prop-true{background:#dafbe1}
td.st-known{background:#fff8c5}td.st-inconclusive{background:#eaeef2}
.hidden{display:none!important}
"""
CSS += "".join(f".o-{o}{{background:{c}}}details.failure.o-{o}{{border-color:{c};"
               f"background:none}}" for o, c in COLORS.items())

# Opening a drill-down or failure link opens its <details> (and the ones around it); the
# filter box hides grid rows, drill-downs and failures of other ops.
SCRIPT = """
function openTarget(){var id=decodeURIComponent(location.hash.slice(1));if(!id)return;
var el=document.getElementById(id);for(var n=el;n;n=n.parentElement){
if(n.tagName==='DETAILS')n.open=true;}if(el)el.scrollIntoView();}
window.addEventListener('hashchange',openTarget);window.addEventListener('load',openTarget);
function applyFilter(sec){var q=sec.querySelector('input.q').value.trim().toLowerCase();
var bad=sec.querySelector('input.bad').checked;
sec.querySelectorAll('[data-filter-op]').forEach(function(el){
var hit=el.dataset.filterOp.toLowerCase().indexOf(q)>=0&&(!bad||el.dataset.bad==='1');
el.classList.toggle('hidden',!hit);});
sec.querySelectorAll('tr.fam').forEach(function(f){var n=f.nextElementSibling,any=false;
while(n&&!n.classList.contains('fam')){if(!n.classList.contains('hidden'))any=true;
n=n.nextElementSibling;}f.classList.toggle('hidden',!any);});}
document.addEventListener('input',function(ev){var s=ev.target.closest('section.backend');
if(s&&ev.target.closest('.filter'))applyFilter(s);});
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def anchor(*parts: Any) -> str:
    """A stable, URL-safe element id for a backend / cell / instance."""
    return "x" + hashlib.sha1("\x1f".join(map(str, parts)).encode()).hexdigest()[:12]


def worst(outcomes: Counter[str]) -> str:
    return next((o for o in SEVERITY if outcomes.get(o)),
                next(iter(outcomes), "skipped"))


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort key putting ``n1, n1000, n65536, n1048576`` in numeric order."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p)
                 for p in re.split(r"(\d+)", text) if p)


def counts_text(outcomes: Counter[str]) -> str:
    """``3 failed, 45 passed``: worst first, outcomes outside the palette last."""
    order = [*SEVERITY, *sorted(set(outcomes) - set(SEVERITY))]
    return ", ".join(f"{outcomes[o]} {o}" for o in order if outcomes.get(o))


def _badge(outcome: str) -> str:
    return f'<span class="badge o-{_e(outcome)}">{_e(outcome)}</span>'


def _bar(outcomes: Counter[str]) -> str:
    total = sum(outcomes.values()) or 1
    order = [*SEVERITY, *sorted(set(outcomes) - set(SEVERITY))]
    return ('<div class="bar">' + "".join(
        f'<span class="o-{_e(o)}" style="width:{100 * outcomes[o] / total:.2f}%"></span>'
        for o in order if outcomes.get(o)) + "</div>")


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {"b": true}}`` -> ``[("a.b", True)]`` for ordering properties."""
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, value)]


ORDERING_CHECKS = tuple(key for key, _ in ordering_table.COLUMNS)


def ordering_props(ordering: dict[str, Any]) -> list[tuple[str, Any]]:
    """The properties worth showing: each check's verdict (True ok, False violated, "known"
    for a violation an override documents, else its status; n/a left out) and the observed
    host-blocking form. Other shapes are flattened."""
    if not any(isinstance(ordering.get(k), dict) and "status" in ordering[k]
               for k in ORDERING_CHECKS):
        return flatten(ordering)
    out: list[tuple[str, Any]] = []
    for key in ORDERING_CHECKS:
        verdict = ordering.get(key)
        if not isinstance(verdict, dict) or verdict.get("status") == "n/a":
            continue
        status = ordering_table.status(verdict)
        out.append((key, True if status == "ok" else False if status == "violated" else status))
        if key == "host_blocking" and verdict.get("observed"):
            out.append(("host_blocking.observed", verdict["observed"]))
    return out


def _prop_cell(value: Any) -> str:
    if isinstance(value, bool):
        return f'<td class="prop-{str(value).lower()}">{"yes" if value else "no"}</td>'
    text = value if isinstance(value, str) else json.dumps(value)
    cls = f' class="st-{_e(text)}"' if text in ordering_table.SYMBOLS else ""
    return f"<td{cls}>{_e(text)}</td>"


def dtype_groups(names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The grid's columns: (group label, dtypes in the harness's order), empty groups left
    out."""
    order = list(dtypes.DTYPES)
    out: list[tuple[str, list[str]]] = []
    placed: set[str] = set()
    for label, kinds in DTYPE_GROUPS:
        members = [d for d in names if d in dtypes.DTYPES and dtypes.DTYPES[d].kind in kinds]
        placed.update(members)
        if label == "other":
            members += sorted(set(names) - placed - set(members))
        if members:
            out.append((label, sorted(members, key=lambda d: (
                order.index(d) if d in order else len(order), d))))
    return out


def _families(backend: str, recs: list[dict[str, Any]]) -> list[str]:
    fams: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        for fam in dict.fromkeys(f for _, f in filed_under(r)):
            fams[fam].append(r)
    out = ['<table class="families"><thead><tr><th>family</th><th>ops</th><th>instances</th>'
           "<th>outcomes</th><th>counts</th></tr></thead><tbody>"]
    for fam in sorted(fams):
        group = fams[fam]
        counts = Counter(shown(r) for r in group)
        w = worst(counts)
        ops = sorted({op for r in group for op, f in filed_under(r) if f == fam})
        out.append(f'<tr data-family="{_e(fam)}" data-outcome="{w}"><td>'
                   f'<a href="#{anchor("fam", backend, fam)}"><code>{_e(fam)}</code></a></td>'
                   f"<td>{len(ops)}</td><td>{len(group)}</td><td>{_bar(counts)}</td>"
                   f"<td>{_e(counts_text(counts))}</td></tr>")
    out.append("</tbody></table>")
    return out


def _is_bad(outcomes: Counter[str]) -> bool:
    return any(outcomes.get(o) for o in UNEXPECTED_OUTCOMES)


def _grid(backend: str, recs: list[dict[str, Any]]) -> list[str]:
    groups = dtype_groups(sorted({r["dtype"] for r in recs}))
    columns = [d for _, members in groups for d in members]
    starts = {members[0] for _, members in groups}
    cells: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    fam_of: dict[str, str] = {}
    for r in recs:
        for op, fam in filed_under(r):
            cells[(op, r["dtype"])][shown(r)] += 1
            fam_of[op] = fam
    out = ['<div class="gridwrap"><table class="grid matrix" '
           f'data-backend="{_e(backend)}"><thead><tr class="groups">'
           '<th class="corner" rowspan="2">op</th>']
    out += [f'<th colspan="{len(m)}" class="gs">{_e(label)}</th>' for label, m in groups]
    out.append('</tr><tr class="dtypes">')
    out += [f'<th{" class=gs" if d in starts else ""} title="{_e(d)}"><div class="vt">'
            f"{_e(d)}</div></th>" for d in columns]
    out.append("</tr></thead><tbody>")
    for fam in sorted(set(fam_of.values())):
        out.append(f'<tr class="fam" id="{anchor("fam", backend, fam)}"><th>{_e(fam)}</th>'
                   f'<td colspan="{len(columns)}"></td></tr>')
        for op in sorted(o for o, f in fam_of.items() if f == fam):
            row_bad = any(_is_bad(cells.get((op, d), Counter())) for d in columns)
            out.append(f'<tr data-filter-op="{_e(op)} {_e(fam)}" data-bad="{int(row_bad)}">'
                       f'<th class="op" scope="row">{_e(op)}</th>')
            for d in columns:
                gs = " gs" if d in starts else ""
                counts = cells.get((op, d))
                if not counts:
                    out.append(f'<td class="empty{gs}" data-op="{_e(op)}" '
                               f'data-dtype="{_e(d)}"></td>')
                    continue
                w = worst(counts)
                n = sum(counts.values())
                tip = f"{op} \u00d7 {d}: {counts_text(counts)}"
                out.append(f'<td class="c cell o-{w}{gs}" data-op="{_e(op)}" data-dtype="{_e(d)}"'
                           f' data-outcome="{w}" data-count="{n}" title="{_e(tip)}">'
                           f'<a href="#{anchor("d", backend, op, d)}">{n}</a></td>')
            out.append("</tr>")
    out.append("</tbody></table></div>")
    return out


def _filter_box() -> str:
    return ('<div class="filter"><label>Filter ops: <input type="search" class="q" '
            'placeholder="e.g. all_gather" aria-label="filter ops"></label>'
            '<label><input type="checkbox" class="bad"> only ops with problems</label></div>')


def _ordering(recs: list[dict[str, Any]]) -> list[str]:
    """The async-contract table: per op, each check's statuses, as the Markdown shows them
    (a violation an override documents is "known", not a failure)."""
    summary = ordering_table.summarize(recs)
    if not summary:
        return []
    n = sum(cells["instances"]["n"] for cells in summary.values())
    out = [f"<h3>Async contract ({n} instances)</h3>",
           '<p class="meta">ok, violated, known (violated as an override documents), '
           "inconclusive (the values were wrong even without delays); - not checked.</p>",
           '<table class="ordering"><thead><tr><th>op</th><th>instances</th>']
    out += [f"<th>{_e(title)}</th>" for _, title in ordering_table.COLUMNS]
    out.append("<th>blocking form</th></tr></thead><tbody>")
    for op in sorted(summary):
        cells = summary[op]
        out.append(f'<tr data-filter-op="{_e(op)}"><td><code>{_e(op)}</code></td>'
                   f"<td>{cells['instances']['n']}</td>")
        for key, _ in ordering_table.COLUMNS:
            st = cells[key]
            top = next((s for s in ordering_table.SYMBOLS if st.get(s)), "")
            text = ", ".join(f"{s} {st[s]}" for s in ordering_table.SYMBOLS if st.get(s))
            out.append(f'<td class="st-{top}">{_e(text or "-")}</td>')
        obs = cells["observed"]
        out.append(f"<td>{_e(', '.join(f'{v} x{k}' for v, k in obs.most_common()) or '-')}"
                   "</td></tr>")
    out.append("</tbody></table>")
    known = ordering_table.documented(recs)
    if known:
        out.append("<p>Documented ordering divergences (overrides):</p><ul>")
        out += [f"<li><code>{_e(op)}</code> {_e(key.replace('_', '-'))}: {_e(reason)}</li>"
                for op, key, reason in known]
        out.append("</ul>")
    return out


def _rank_detail(r: dict[str, Any]) -> list[str]:
    out = ['<table class="ranks"><thead><tr><th>rank</th><th>status</th><th>state</th>'
           "<th>step</th><th>checks</th></tr></thead><tbody>"]
    extra: list[str] = []
    for rk in r["ranks"]:
        checks = rk.get("checks", [])
        bad = [c for c in checks if not c["ok"]]
        ctext = (f"{len(checks) - len(bad)}/{len(checks)} ok" if checks else "")
        if bad:
            ctext += "; " + "; ".join(f"{c['tensor']}: {c['wrong']} of {c['total']} wrong"
                                      for c in bad)
        step = rk.get("step_desc") or rk.get("step", "")
        out.append(f"<tr><td>{rk['rank']}</td><td>{_e(rk['status'])}</td>"
                   f"<td>{_e(rk.get('state', ''))}</td><td>{_e(step)}</td>"
                   f"<td>{_e(ctext)}</td></tr>")
        exc = rk.get("exception")
        blocks = [("traceback", exc.get("traceback", "") if exc else ""),
                  ("Python stack", rk.get("stack", "")),
                  ("last output", rk.get("stderr_tail", "")),
                  ("flight recorder", "\n".join(rk.get("flight_recorder", [])))]
        for title, text in blocks:
            if text:
                extra.append(f"<details><summary>rank {rk['rank']}: {title}</summary>"
                             f"<pre>{_e(text)}</pre></details>")
    out.append("</tbody></table>")
    return out + extra


def _failures(recs: list[dict[str, Any]]) -> list[str]:
    bad = [r for r in recs if r["outcome"] in UNEXPECTED_OUTCOMES]
    if not bad:
        return []
    out = [f"<h3>Failures ({len(bad)})</h3>"]
    for r in sorted(bad, key=lambda r: natural_key(r["key"])):
        first = one_line(r, limit=240) or r["outcome"]
        issued = " ".join(o for o, _ in filed_under(r))
        out.append(f'<details class="failure o-{r["outcome"]}" id="{anchor("f", r["key"])}" '
                   f'data-key="{_e(r["key"])}" data-filter-op="{_e(issued)}" data-bad="1">'
                   f'<summary>{_badge(r["outcome"])} '
                   f'<code>{_e(r["case"])}[{_e(r["id"])}]</code> <span class="meta">'
                   f'{_e(r["file"])}:{r["line"]}</span> — {_e(first)}</summary>')
        wrong = first_wrong(r)
        out.append(f'<p class="meta">{_e(r.get("description", ""))}</p>'
                   + (f'<p class="first-wrong">first wrong: <code>{_e(wrong)}</code></p>'
                      if wrong else "") + f"<pre>{_e(r['message'])}</pre>")
        if r.get("ordering"):
            out.append("<table><tbody>" + "".join(
                f"<tr><td><code>{_e(k)}</code></td>{_prop_cell(v)}</tr>"
                for k, v in ordering_props(r["ordering"])) + "</tbody></table>")
        out += _rank_detail(r)
        out.append("</details>")
    return out


def _order_chip(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return (f'<span class="badge o-{"passed" if value else "failed"}" title="{_e(key)}">'
                f"{_e(key)}</span>")
    if value == "known":
        return f'<span class="badge o-xfail" title="{_e(key)}: documented">{_e(key)}</span>'
    return f"{_e(key)}={_e(value)}"


def _drilldown(backend: str, recs: list[dict[str, Any]]) -> list[str]:
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        for op, _ in filed_under(r):
            cells[(op, r["dtype"])].append(r)
    out = ["<h3>Instances by cell</h3>"]
    for (op, d), group in sorted(cells.items()):
        counts = Counter(shown(r) for r in group)
        out.append(f'<details class="drill" id="{anchor("d", backend, op, d)}" '
                   f'data-filter-op="{_e(op)} {_e(dict(filed_under(group[0]))[op])}" '
                   f'data-bad="{int(_is_bad(counts))}"><summary>'
                   f"<code>{_e(op)}</code> &times; <code>{_e(d)}</code>: "
                   f"{_e(counts_text(counts))}</summary><table><thead><tr><th>outcome</th>"
                   "<th>instance</th><th>ws</th><th>mode</th><th>ms</th><th>ordering</th>"
                   "<th>note</th></tr></thead><tbody>")
        for r in sorted(group, key=lambda r: (r["world_size"], str(r.get("async")),
                                              natural_key(r["case"]), natural_key(r["id"]))):
            name = f'<code>{_e(r["case"])}[{_e(r["id"])}]</code>'
            if r["outcome"] in UNEXPECTED_OUTCOMES:
                name = f'<a href="#{anchor("f", r["key"])}">{name}</a>'
            order = ""
            if isinstance(r.get("ordering"), dict):
                order = " ".join(_order_chip(k, v) for k, v in ordering_props(r["ordering"]))
            note = r.get("reason") or (r["message"].splitlines()[0]
                                       if r["outcome"] == "skipped" else "")
            out.append(f"<tr><td>{_badge(shown(r))}</td><td>{name}</td>"
                       f"<td>{r['world_size']}</td><td>{mode(r)}</td>"
                       f"<td>{r.get('duration_s', 0) * 1000:.1f}</td><td>{order}</td>"
                       f"<td>{_e(note)}</td></tr>")
        out.append("</tbody></table></details>")
    return out


def verdict_banner(recs: list[dict[str, Any]], session: dict[str, Any] | None = None,
                   scope: str = "") -> str:
    """The verdict line of ``recs`` (report/headline.py): PASS only when nothing unexpected
    happened and the session is complete. ``scope``: an extra class (``run`` for the whole
    report's line at the top, computed like each backend's)."""
    summary: dict[str, Any] = {**Counter(shown(r) for r in recs), "total": len(recs)}
    word = headline.verdict(summary, session)
    return (f'<p class="banner verdict {scope + " " if scope else ""}'
            f'{"pass" if word == "PASS" else "fail"}">'
            f"{_e(headline.headline(summary, session))}</p>")


def _session_banners(report: dict[str, Any]) -> list[str]:
    """An incomplete session first; then the overrides that did not apply here."""
    out: list[str] = []
    session = report.get("session") if isinstance(report.get("session"), dict) else None
    if session is not None and not session.get("complete", True):
        out.append(f'<p class="banner verdict fail" id="incomplete">INCOMPLETE SESSION: '
                   f"{_e(headline.incomplete_text(session))}. The counts below cover only what"
                   " ran; this report is not a verdict on the backend.</p>")
    scoped = report.get("summary", {}).get("overrides_not_applied") or []
    if scoped:
        out.append('<details class="not-applied"><summary>Overrides not applied because of '
                   f"their torch-version or backend scope: {len(scoped)} override(s), "
                   f"covering {sum(o['instances'] for o in scoped)} instance(s)"
                   "</summary><ul>" + "".join(
                       f"<li><code>{_e(o['file'])}:{o['line']}</code> ({_e(o['when'])}; "
                       f"{o['instances']} instance(s)): {_e(o['reason'])}: "
                       f"{_e(', '.join(o['cases']))}</li>" for o in scoped) + "</ul></details>")
    return out


def legend() -> str:
    """One swatch per palette row, each label right after its own swatch."""
    return ('<div class="legend">' + "".join(
        f'<span class="item" title="{_e(s.meaning)}"><span class="sw o-{s.name}"></span>'
        f"{_e(s.name)}</span>" for s in OUTCOMES) + "</div>")


def render(report: dict[str, Any], title: str = "collective-harness conformance",
           banners: Sequence[str] = (), sections: Sequence[Section] = ()) -> str:
    """The whole report as one HTML document (a string).

    ``banners`` are HTML fragments shown under each backend's verdict; ``sections`` add
    per-backend blocks after the async-contract table (a perf section, say).
    """
    meta = report["metadata"]
    backends = meta.get("backends") or sorted({r["backend"] for r in report["records"]})
    # The verdict first (the run's headline, then how the session ended), the grid next, the
    # legend after it: what a reader needs first is the answer, then where it comes from.
    session = report.get("session") if isinstance(report.get("session"), dict) else None
    # The run's own verdict, computed from its records like each backend's below.
    body: list[str] = [f"<h1>{_e(title)}</h1>",
                       verdict_banner(report["records"], session, scope="run")]
    body += _session_banners(report)
    body.append(f'<p class="meta">torch {_e(meta.get("torch", "?"))} · Python '
                f'{_e(meta.get("python", "?"))} · host {_e(meta.get("hostname", "?"))} · '
                f'{_e(meta.get("created", ""))}</p>')
    legend_block = [legend(), '<p class="meta">limitation: the case expects this backend to '
                    "reject the call, crash or hang (an override with its reason), and it did. "
                    "Each grid cell is one op &times; dtype, colored by its worst outcome, with "
                    "its number of instances; hover for the counts, click for every "
                    "instance.</p>"]
    if not backends:
        body += legend_block
    for n, backend in enumerate(backends):
        recs = [r for r in report["records"] if r["backend"] == backend]
        body.append(f'<section class="backend" id="{anchor("b", backend)}" '
                    f'data-backend="{_e(backend)}">')
        body.append(f"<h2>{_e(backend)} on {_e(devices_label(recs))}</h2>")
        if len(backends) > 1:  # with one backend its verdict is the run's, shown at the top
            body.append(verdict_banner(recs, session))
        body += [f'<div class="banner note">{b}</div>' for b in banners]
        body.append(_filter_box())
        body += _grid(backend, recs)
        if n == 0:
            body += legend_block
        body += _families(backend, recs)
        body += _ordering(recs)
        body += errors_table.html(recs)
        for section in sections:
            body += section(backend, recs)
        body += _failures(recs)
        skipped = Counter(r.get("reason") or r["message"] for r in recs
                          if r["outcome"] == "skipped")
        if skipped:
            body.append("<h3>Skipped</h3><ul>" + "".join(
                f"<li>{n} &times; {_e(reason)}</li>" for reason, n in skipped.most_common())
                + "</ul>")
        body += _drilldown(backend, recs)
        body.append("</section>")
    body += perf_section(report)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><meta name=\"viewport\" content=\"width=device-width\">"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body)
            + f"\n<script>{SCRIPT}</script>\n</body></html>\n")
