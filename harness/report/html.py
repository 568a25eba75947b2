"""HTML conformance report: one self-contained page (inline CSS and a few lines of inline
script, no fetches), so it can be opened from a CI artifact or a file:// URL.

Per backend: the verdict, an op x dtype matrix whose cells hold one colored chip per
(world size, sync/async) combination, the ordering-check properties when records carry an
``ordering`` dict, the failures (each a ``<details>``: one click shows the whole message and
every rank's state), and a drill-down table per matrix cell.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections import Counter, defaultdict
from typing import Any

from . import headline
from .markdown import BAD
from .oneline import one_line
from .perf_html import render as perf_section

# Worst first: a cell or chip takes the color of its worst outcome.
# "limitation": the backend rejected, crashed or hung as the case declares (not a pass), shown
# apart so such a cell does not look green.
SEVERITY = ("crash", "hang", "error", "failed", "xpass", "xfail", "limitation", "passed",
            "skipped")
COLORS = {"passed": "#2da44e", "failed": "#cf222e", "error": "#8250df", "hang": "#fb8500",
          "crash": "#24292f", "xfail": "#d4a72c", "xpass": "#e85aad", "skipped": "#8c959f",
          "limitation": "#0969da"}


def shown(r: dict[str, Any]) -> str:
    """What the matrix shows for a record: its outcome ("limitation" also for reports written
    before it was an outcome, where a declared failure mode counted as passed)."""
    if r["outcome"] == "passed" and r.get("expected", "pass") != "pass" and r.get("reason"):
        return "limitation"
    return str(r["outcome"])
ASYNC_LABEL = {True: "a", False: "s", "mixed": "m", None: ""}
MODE = {True: "async", False: "sync", "mixed": "mixed sync/async steps", None: "no async axis"}

CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 24px 48px;color:#1f2328}
h1{font-size:22px;margin:16px 0 4px}h2{font-size:19px;margin:28px 0 6px;
border-bottom:1px solid #d0d7de}h3{font-size:16px;margin:18px 0 6px}
.meta{color:#57606a;margin:2px 0}.verdict{font-weight:600;font-size:16px;padding:6px 10px;
border-radius:6px;display:inline-block}.verdict.pass{background:#dafbe1}.verdict.fail{
background:#ffebe9}.legend span{margin-right:10px;white-space:nowrap}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #d0d7de;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f6f8fa}
table.matrix td.cell{min-width:90px}table.matrix td.empty{background:#fafbfc}
.chips{display:flex;flex-wrap:wrap;gap:2px}
a.chip,span.chip{display:inline-block;min-width:22px;padding:1px 4px;border-radius:3px;
color:#fff;font:11px/16px ui-monospace,monospace;text-align:center;text-decoration:none}
.count{display:block;font-size:11px;color:#57606a;margin-top:2px}
.badge{display:inline-block;padding:0 5px;border-radius:3px;color:#fff;font-size:12px}
details{margin:3px 0}details>summary{cursor:pointer}details.failure{border-left:4px solid;
padding-left:8px}pre{background:#f6f8fa;padding:6px;overflow:auto;max-height:420px;
white-space:pre-wrap;margin:4px 0}code{font-family:ui-monospace,monospace}
td.prop-true{background:#dafbe1}td.prop-false{background:#ffebe9}
"""
CSS += "".join(f".o-{o}{{background:{c}}}details.failure.o-{o}{{border-color:{c};"
               f"background:none}}" for o, c in COLORS.items())
CSS += "".join(f"td.cell.w-{o}{{background:{c}22}}" for o, c in COLORS.items())

# Opening a drill-down or failure link opens its <details> (and the ones around it).
SCRIPT = """
function openTarget(){var id=decodeURIComponent(location.hash.slice(1));if(!id)return;
var el=document.getElementById(id);for(var n=el;n;n=n.parentElement){
if(n.tagName==='DETAILS')n.open=true;}if(el)el.scrollIntoView();}
window.addEventListener('hashchange',openTarget);window.addEventListener('load',openTarget);
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def anchor(*parts: Any) -> str:
    """A stable, URL-safe element id for a backend / cell / instance."""
    return "x" + hashlib.sha1("\x1f".join(map(str, parts)).encode()).hexdigest()[:12]


def worst(outcomes: Counter[str]) -> str:
    return next((o for o in SEVERITY if outcomes.get(o)), "skipped")


def _counts_text(outcomes: Counter[str]) -> str:
    return ", ".join(f"{outcomes[o]} {o}" for o in SEVERITY if outcomes.get(o))


def _badge(outcome: str) -> str:
    return f'<span class="badge o-{_e(outcome)}">{_e(outcome)}</span>'


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {"b": true}}`` -> ``[("a.b", True)]`` for ordering properties."""
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for k, v in value.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, value)]


ORDERING_CHECKS = ("pre_op", "post_wait", "completion", "host_blocking", "declared")


def ordering_props(ordering: dict[str, Any]) -> list[tuple[str, Any]]:
    """The properties worth showing: each check's verdict (True ok, False violated, else its
    status; n/a left out) and the observed host-blocking form. Other shapes are flattened."""
    if not any(isinstance(ordering.get(k), dict) and "status" in ordering[k]
               for k in ORDERING_CHECKS):
        return flatten(ordering)
    out: list[tuple[str, Any]] = []
    for key in ORDERING_CHECKS:
        verdict = ordering.get(key)
        if not isinstance(verdict, dict) or verdict.get("status") == "n/a":
            continue
        status = verdict.get("status")
        out.append((key, True if status == "ok" else False if status == "violated" else status))
        if key == "host_blocking" and verdict.get("observed"):
            out.append(("host_blocking.observed", verdict["observed"]))
    return out


def _prop_cell(value: Any) -> str:
    if isinstance(value, bool):
        return f'<td class="prop-{str(value).lower()}">{"yes" if value else "no"}</td>'
    text = value if isinstance(value, str) else json.dumps(value)
    return f"<td>{_e(text)}</td>"


def _combo(r: dict[str, Any]) -> tuple[int, bool | str | None]:
    """World size and mode; a program's async axis is derived from its steps (async, sync or
    mixed), a shorthand instance's is its ``async`` flag."""
    if "async" not in r["axes"]:
        return (r["world_size"], None)
    axis = r["axes"]["async"]
    mode: bool | str = {"async": True, "sync": False}.get(axis, axis) if isinstance(
        axis, str) else bool(axis)
    return (r["world_size"], mode)


def _matrix(backend: str, recs: list[dict[str, Any]]) -> list[str]:
    dtypes = sorted({r["dtype"] for r in recs})
    ops = sorted({r["op"] for r in recs})
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        cells[(r["op"], r["dtype"])].append(r)
    out = [f'<table class="matrix" data-backend="{_e(backend)}"><thead><tr><th>op</th>']
    out += [f"<th>{_e(d)}</th>" for d in dtypes]
    out.append("</tr></thead><tbody>")
    for op in ops:
        out.append(f'<tr><th scope="row">{_e(op)}</th>')
        for d in dtypes:
            group = cells.get((op, d), [])
            if not group:
                out.append(f'<td class="empty" data-op="{_e(op)}" data-dtype="{_e(d)}"></td>')
                continue
            counts = Counter(shown(r) for r in group)
            w = worst(counts)
            out.append(f'<td class="cell w-{w}" data-op="{_e(op)}" data-dtype="{_e(d)}" '
                       f'data-outcome="{w}" data-count="{len(group)}" '
                       f'title="{_e(_counts_text(counts))}"><div class="chips">')
            combos: dict[tuple[int, bool | str | None], Counter[str]] = defaultdict(Counter)
            for r in group:
                combos[_combo(r)][shown(r)] += 1
            for (ws, asy), cc in sorted(combos.items(), key=lambda kv: (kv[0][0],
                                                                       str(kv[0][1]))):
                cw = worst(cc)
                first_bad = next((r for r in sorted(group, key=lambda r: r["key"])
                                  if _combo(r) == (ws, asy) and r["outcome"] == cw
                                  and (cw in BAD or cw == "xpass")), None)
                href = anchor("f", first_bad["key"]) if first_bad else anchor("d", backend,
                                                                              op, d)
                mode = MODE[asy]
                out.append(f'<a class="chip o-{cw}" href="#{href}" data-world-size="{ws}" '
                           f'data-async="{_e(asy)}" data-outcome="{cw}" title="world size {ws},'
                           f' {mode}: {_e(_counts_text(cc))}">{ws}{ASYNC_LABEL[asy]}</a>')
            out.append(f'</div><a class="count" href="#{anchor("d", backend, op, d)}">'
                       f'{_e(_counts_text(counts))}</a></td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return out


def _ordering(recs: list[dict[str, Any]]) -> list[str]:
    with_ordering = [r for r in recs if isinstance(r.get("ordering"), dict) and r["ordering"]]
    if not with_ordering:
        return []
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for r in with_ordering:
        for name, value in ordering_props(r["ordering"]):
            table[name][json.dumps(value) if not isinstance(value, str) else value] += 1
    out = [f"<h3>Ordering checks ({len(with_ordering)} instances)</h3>",
           '<table class="ordering"><thead><tr><th>property</th><th>values (instances)</th>'
           "</tr></thead><tbody>"]
    for name in sorted(table):
        vals = table[name]
        cls = ("prop-false" if vals.get("false") else "prop-true" if vals.get("true") else "")
        text = ", ".join(f"{v}: {n}" for v, n in sorted(vals.items()))
        out.append(f'<tr><td><code>{_e(name)}</code></td><td class="{cls}">{_e(text)}</td></tr>')
    out.append("</tbody></table>")
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
    bad = [r for r in recs if r["outcome"] in BAD or r["outcome"] == "xpass"]
    if not bad:
        return []
    out = [f"<h3>Failures ({len(bad)})</h3>"]
    for r in sorted(bad, key=lambda r: r["key"]):
        first = one_line(r, limit=240) or r["outcome"]
        out.append(f'<details class="failure o-{r["outcome"]}" id="{anchor("f", r["key"])}" '
                   f'data-key="{_e(r["key"])}"><summary>{_badge(r["outcome"])} '
                   f'<code>{_e(r["case"])}[{_e(r["id"])}]</code> <span class="meta">'
                   f'{_e(r["file"])}:{r["line"]}</span> — {_e(first)}</summary>')
        out.append(f'<p class="meta">{_e(r.get("description", ""))}</p>'
                   f"<pre>{_e(r['message'])}</pre>")
        if r.get("ordering"):
            out.append("<table><tbody>" + "".join(
                f"<tr><td><code>{_e(k)}</code></td>{_prop_cell(v)}</tr>"
                for k, v in ordering_props(r["ordering"])) + "</tbody></table>")
        out += _rank_detail(r)
        out.append("</details>")
    return out


def _drilldown(backend: str, recs: list[dict[str, Any]]) -> list[str]:
    cells: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        cells[(r["op"], r["dtype"])].append(r)
    out = ["<h3>Instances by cell</h3>"]
    for (op, d), group in sorted(cells.items()):
        counts = Counter(shown(r) for r in group)
        out.append(f'<details class="drill" id="{anchor("d", backend, op, d)}"><summary>'
                   f"<code>{_e(op)}</code> &times; <code>{_e(d)}</code>: {_e(_counts_text(counts))}"
                   "</summary><table><thead><tr><th>outcome</th><th>instance</th><th>ws</th>"
                   "<th>mode</th><th>ms</th><th>ordering</th><th>note</th></tr></thead><tbody>")
        for r in sorted(group, key=lambda r: (r["world_size"], str(r.get("async")), r["key"])):
            name = f'<code>{_e(r["case"])}[{_e(r["id"])}]</code>'
            if r["outcome"] in BAD or r["outcome"] == "xpass":
                name = f'<a href="#{anchor("f", r["key"])}">{name}</a>'
            order = ""
            if isinstance(r.get("ordering"), dict):
                order = " ".join(
                    f'<span class="chip o-{"passed" if v else "failed"}" title="{_e(k)}">'
                    f'{_e(k.removesuffix(".ok"))}</span>' if isinstance(v, bool)
                    else f"{_e(k)}={_e(v)}" for k, v in ordering_props(r["ordering"]))
            asy = _combo(r)[1]
            mode = "-" if asy is None else "mixed" if asy == "mixed" else MODE[asy]
            note = r.get("reason") or (r["message"].splitlines()[0]
                                       if r["outcome"] == "skipped" else "")
            out.append(f"<tr><td>{_badge(shown(r))}</td><td>{name}</td>"
                       f"<td>{r['world_size']}</td><td>{mode}</td>"
                       f"<td>{r.get('duration_s', 0) * 1000:.1f}</td><td>{order}</td>"
                       f"<td>{_e(note)}</td></tr>")
        out.append("</tbody></table></details>")
    return out


def render(report: dict[str, Any], title: str = "collective-harness conformance") -> str:
    """The whole report as one HTML document (a string)."""
    meta = report["metadata"]
    backends = meta.get("backends") or sorted({r["backend"] for r in report["records"]})
    body: list[str] = [f"<h1>{_e(title)}</h1>",
                       f'<p class="meta">torch {_e(meta.get("torch", "?"))} · Python '
                       f'{_e(meta.get("python", "?"))} · host {_e(meta.get("hostname", "?"))} · '
                       f'{_e(meta.get("created", ""))}</p>',
                       '<p class="legend">' + "".join(
                           f'<span><span class="chip o-{o}">&nbsp;</span> {o}</span>'
                           for o in SEVERITY) + "</p>"
                       '<p class="meta">limitation: the case expects this backend to reject the '
                       "call, crash or hang (an override with its reason), and it did.</p>",
                       '<p class="meta">Each cell: one chip per world size, s = sync, a = async;'
                       " click a chip for its first failure or the cell's instances.</p>"]
    session = report.get("session") if isinstance(report.get("session"), dict) else None
    if session is not None and not session.get("complete", True):
        body.insert(1, f'<p class="verdict fail" id="incomplete">INCOMPLETE SESSION: '
                    f"{_e(headline.incomplete_text(session))}. The counts below cover only what"
                    " ran; this report is not a verdict on the backend.</p>")
    scoped = report.get("summary", {}).get("overrides_not_applied") or []
    if scoped:
        body.append('<details class="not-applied"><summary>Overrides not applied because of '
                    f"their torch-version or backend scope: {len(scoped)} override(s), "
                    f"covering {sum(o['instances'] for o in scoped)} instance(s)"
                    "</summary><ul>" + "".join(
                        f"<li><code>{_e(o['file'])}:{o['line']}</code> ({_e(o['when'])}; "
                        f"{o['instances']} instance(s)): {_e(o['reason'])}: "
                        f"{_e(', '.join(o['cases']))}</li>" for o in scoped) + "</ul></details>")
    for backend in backends:
        recs = [r for r in report["records"] if r["backend"] == backend]
        counts = Counter(shown(r) for r in recs)
        devices = ", ".join(sorted({r["device"] for r in recs})) or "-"
        body.append(f'<section class="backend" id="{anchor("b", backend)}" '
                    f'data-backend="{_e(backend)}">')
        body.append(f"<h2>{_e(backend)} on {_e(devices)}</h2>")
        summary = {**counts, "total": len(recs)}
        word = headline.verdict(summary, session)
        body.append(f'<p class="verdict {"pass" if word == "PASS" else "fail"}">'
                    f"{_e(headline.headline(summary, session))}</p>")
        body += _matrix(backend, recs)
        body += _ordering(recs)
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
