"""The "Numerics" section of the Markdown and HTML reports: the worst error against the FP64
reference per op x dtype x world size, so accumulation loss growing with the world size shows
at a glance (the HTML adds a small inline SVG line per row; no scripts), and the instances
that were uncheckable or broke a numerics property.

Reads only the records' ``numerics`` blocks (harness.verdict.numerics). Rows whose every
instance was bit-exact against FP64 are left out and counted. Instances declared known-wrong
(``xfail``) or declared to be rejected (``limitation``) are left out of the table too and
counted: a known-wrong result's error is not the backend's accuracy, and a worst-error cell
cannot carry a mark; below the table they are listed last, each marked with its outcome.
"""

from __future__ import annotations

import math
from collections import defaultdict
from html import escape as _e
from typing import Any

from .mdtext import code, escape

Key = tuple[str, str]  # (op, dtype)
# Outcomes declared in the case (a known-wrong result, a declared rejection): not in the table.
DECLARED = ("xfail", "limitation")


def _measured(r: dict[str, Any]) -> dict[str, Any]:
    errors = (r.get("numerics") or {}).get("error") or {}
    return errors if isinstance(errors, dict) else {}


def declared(recs: list[dict[str, Any]]) -> int:
    """How many instances measured an error but are left out of the table as declared
    (``xfail``, ``limitation``)."""
    return sum(1 for r in recs if r.get("outcome") in DECLARED and _measured(r))


def summarize(recs: list[dict[str, Any]]) -> tuple[dict[Key, dict[int, dict[str, float]]], int]:
    """Per (op, dtype), per world size, the worst of each metric over instances and buffers
    (declared outcomes left out: :func:`declared`); and how many measured instances were left
    out because every error was zero."""
    table: dict[Key, dict[int, dict[str, float]]] = defaultdict(dict)
    measured: dict[Key, int] = defaultdict(int)
    for r in recs:
        errors = _measured(r)
        if not errors or r.get("outcome") in DECLARED:
            continue
        key = (str(r.get("op", "?")), str(r.get("dtype", "?")))
        measured[key] += 1
        cell = table[key].setdefault(int(r.get("world_size", 0)), {})
        for metrics in errors.values():
            for name, value in (metrics.items() if isinstance(metrics, dict) else ()):
                if isinstance(value, int | float) and math.isfinite(value):
                    cell[name] = max(cell.get(name, 0.0), float(value))
    zero = [k for k, row in table.items()
            if not any(v for cell in row.values() for v in cell.values())]
    left_out = sum(measured[k] for k in zero)
    for k in zero:
        del table[k]
    return dict(sorted(table.items())), left_out


def _cell(metrics: dict[str, float] | None) -> str:
    if metrics is None:
        return "-"
    rel = metrics.get("rel_l2")
    parts = [f"rel L2 {rel:.2g}" if rel is not None else "",
             f"{metrics.get('max_ulps', 0):.3g} ulp"]
    return " · ".join(p for p in parts if p)


def flagged(recs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(instance key, what): uncheckable instances and numerics properties that broke; those
    of declared outcomes last, each marked with its outcome."""
    out: list[tuple[str, str]] = []
    known: list[tuple[str, str]] = []
    for r in recs:
        num = r.get("numerics") or {}
        mark = f"{r.get('outcome')} (declared): " if r.get("outcome") in DECLARED else ""
        into = known if mark else out
        if num.get("uncheckable"):
            into.append((str(r["key"]), f"{mark}uncheckable: {num['uncheckable']}"))
        for prop, verdict in sorted((num.get("properties") or {}).items()):
            if verdict != "held":
                into.append((str(r["key"]), f"{mark}{prop}: {verdict}"))
    return out + known


def _declared_text(recs: list[dict[str, Any]]) -> str:
    n = declared(recs)
    return (f"{n} xfail or limitation instance(s) left out of the table: declared known-wrong "
            "or rejected, so their error is not the backend's accuracy." if n else "")


def markdown(recs: list[dict[str, Any]]) -> list[str]:
    """The Markdown section (empty when no record measured an error)."""
    table, left_out = summarize(recs)
    bad = flagged(recs)
    if not table and not bad and not declared(recs):
        return []
    out = ["### Numerics: worst error against FP64", ""]
    if table:
        sizes = sorted({ws for row in table.values() for ws in row})
        out.append("| op | dtype | " + " | ".join(f"ws {ws}" for ws in sizes) + " |")
        out.append("|---|---|" + "---|" * len(sizes))
        for (op, dtype), row in table.items():
            out.append(f"| {code(op)} | {escape(dtype)} | "
                       + " | ".join(_cell(row.get(ws)) for ws in sizes) + " |")
        out.append("")
    if left_out:
        out.append(f"{left_out} more instance(s) were bit-exact against FP64 (rows left out).")
        out.append("")
    if _declared_text(recs):
        out += [_declared_text(recs), ""]
    for key, what in bad[:50]:
        out.append(f"- {code(key)}: {escape(what)}")
    if bad:
        out.append("")
    return out


def _spark(row: dict[int, dict[str, float]], lo: float, hi: float) -> str:
    """An inline SVG line of log10(rel L2) over the world sizes (120 x 28)."""
    pts = [(ws, m["rel_l2"]) for ws, m in sorted(row.items()) if m.get("rel_l2")]
    if not pts:
        return ""
    w, h, pad = 120, 28, 3
    first, last = pts[0][0], pts[-1][0]
    span_x, span_y = max(last - first, 1), max(hi - lo, 1e-9)

    def xy(ws: int, v: float) -> str:
        x = pad + (w - 2 * pad) * (ws - first) / span_x
        y = h - pad - (h - 2 * pad) * (math.log10(v) - lo) / span_y
        return f"{x:.1f},{y:.1f}"

    title = ", ".join(f"ws {ws}: {v:.2g}" for ws, v in pts)
    dots = "".join(f'<circle cx="{xy(ws, v).split(",")[0]}" cy="{xy(ws, v).split(",")[1]}" '
                   'r="2" fill="#0969da"/>' for ws, v in pts)
    return (f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            f'aria-label="rel L2 by world size"><title>{_e(title)}</title>'
            f'<polyline fill="none" stroke="#0969da" stroke-width="1.5" points="'
            + " ".join(xy(ws, v) for ws, v in pts) + f'"/>{dots}</svg>')


def html(recs: list[dict[str, Any]]) -> list[str]:
    """The HTML section: the same table, a sparkline per row (log scale shared by all rows)."""
    table, left_out = summarize(recs)
    bad = flagged(recs)
    if not table and not bad and not declared(recs):
        return []
    out = ["<h3>Numerics: worst error against FP64</h3>"]
    if table:
        sizes = sorted({ws for row in table.values() for ws in row})
        logs = [math.log10(m["rel_l2"]) for row in table.values() for m in row.values()
                if m.get("rel_l2")]
        lo, hi = (min(logs), max(logs)) if logs else (0.0, 1.0)
        out.append('<p class="meta">relative L2 error and max ulps, worst over instances, '
                   "buffers and ranks; the line plots log10(rel L2) over the world sizes "
                   f"(one scale for every row: 1e{lo:.1f} to 1e{hi:.1f}).</p>")
        out.append("<table><tr><th>op</th><th>dtype</th>" + "".join(
            f"<th>ws {ws}</th>" for ws in sizes) + "<th>rel L2 by ws</th></tr>")
        for (op, dtype), row in table.items():
            out.append(f"<tr><td><code>{_e(op)}</code></td><td>{_e(dtype)}</td>" + "".join(
                f"<td>{_e(_cell(row.get(ws)))}</td>" for ws in sizes)
                + f"<td>{_spark(row, lo, hi)}</td></tr>")
        out.append("</table>")
    if left_out:
        out.append(f'<p class="meta">{left_out} more instance(s) were bit-exact against FP64 '
                   "(rows left out).</p>")
    if _declared_text(recs):
        out.append(f'<p class="meta">{_e(_declared_text(recs))}</p>')
    if bad:
        out.append("<ul>" + "".join(f"<li><code>{_e(k)}</code>: {_e(w)}</li>"
                                    for k, w in bad[:50]) + "</ul>")
    return out
