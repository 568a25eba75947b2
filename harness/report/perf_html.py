"""The report's bandwidth section (``--perf``) as HTML: one inline-SVG plot per op.

Each plot draws busbw (GB/s) against the message size (bytes, log2 axis), one line per
backend, world size, dtype and form, with a vertical bar from the slowest to the fastest
repeat at every point; hovering a point shows its numbers (an SVG ``<title>``). Everything is
inline (no script, font or image is fetched), like the rest of the page. Below the plots, the
facts that make the numbers comparable and the nccl-tests-style tables, folded.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Any

from . import perf_md

W, H = 680, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 232, 16, 44
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
          "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939")
CSS = (".perf svg{background:#fff;border:1px solid #ccc;margin:6px 12px 6px 0}"
       ".perf .plots{display:flex;flex-wrap:wrap}.perf td,.perf th{padding:1px 6px;"
       "text-align:right}.perf pre{white-space:pre-wrap}")


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def size_label(nbytes: float) -> str:
    """8, 1K, 4M, 1G: the x-axis labels (powers of two)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


def nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * 10 ** exp >= value:
            return float(m * 10 ** exp)
    return float(10 ** (exp + 1))


def plot(op: str, points: list[dict[str, Any]]) -> str:
    """One SVG: busbw against size for every series of ``op``."""
    series: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        series[(p["backend"], p["world_size"], p["dtype"], p["form"])].append(p)
    x_lo = math.log2(min(p["bytes"] for p in points))
    x_hi = max(math.log2(max(p["bytes"] for p in points)), x_lo + 1)
    # Scaled to the medians: one noisy block's bar may run off the top (it is clipped).
    y_hi = nice_max(1.05 * max(p["busbw_gbs"] for p in points))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(nbytes: float) -> float:
        return LEFT + (math.log2(nbytes) - x_lo) / (x_hi - x_lo) * pw

    def y(bw: float) -> float:
        return TOP + ph - min(bw, y_hi) / y_hi * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" role="img" aria-label="busbw of {_e(op)}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{LEFT}" y="12" font-weight="bold">{_e(op)}</text>']
    for i in range(6):  # y grid
        v = y_hi * i / 5
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#eee"/><text x="{LEFT - 4}" y="{y(v) + 4:.1f}" '
                   f'text-anchor="end">{v:g}</text>')
    step = max(1, math.ceil((x_hi - x_lo) / 10))
    k = math.ceil(x_lo)
    while k <= x_hi:  # x ticks at powers of two
        out.append(f'<line x1="{x(2 ** k):.1f}" x2="{x(2 ** k):.1f}" y1="{TOP}" '
                   f'y2="{TOP + ph}" stroke="#f3f3f3"/><text x="{x(2 ** k):.1f}" '
                   f'y="{TOP + ph + 14}" text-anchor="middle">{size_label(2 ** k)}</text>')
        k += step
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" '
               f'stroke="#999"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 6}" text-anchor="middle">message size '
               f'(bytes, nccl-tests "size")</text>')
    out.append(f'<text transform="translate(14 {TOP + ph / 2}) rotate(-90)" '
               f'text-anchor="middle">busbw (GB/s)</text>')
    for n, (key, pts) in enumerate(sorted(series.items())):
        color = COLORS[n % len(COLORS)]
        backend, ws, dtype, form = key
        pts.sort(key=lambda p: p["bytes"])
        dash = ' stroke-dasharray="5 3"' if form == "in-place" else ""
        coords = " ".join(f"{x(p['bytes']):.1f},{y(p['busbw_gbs']):.1f}" for p in pts)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" '
                   f'stroke-width="1.5"{dash}/>')
        for p in pts:
            px = x(p["bytes"])
            tip = (f"{dtype} ws{ws} {form}: {p['bytes']} B, {p['time_us']} us, busbw "
                   f"{p['busbw_gbs']} GB/s (repeats {p['busbw_gbs_min']}..{p['busbw_gbs_max']}),"
                   f" algbw {p['algbw_gbs']} GB/s")
            out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{y(p["busbw_gbs_min"]):.1f}" '
                       f'y2="{y(p["busbw_gbs_max"]):.1f}" stroke="{color}" opacity="0.4"/>'
                       f'<circle cx="{px:.1f}" cy="{y(p["busbw_gbs"]):.1f}" r="2.5" '
                       f'fill="{color}"><title>{_e(tip)}</title></circle>')
        ly = TOP + 4 + n * 14
        name = f"{backend} ws{ws} {dtype} {form}"
        out.append(f'<line x1="{LEFT + pw + 8}" x2="{LEFT + pw + 26}" y1="{ly + 4}" '
                   f'y2="{ly + 4}" stroke="{color}" stroke-width="2"{dash}/>'
                   f'<text x="{LEFT + pw + 30}" y="{ly + 8}">{_e(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def render(report: dict[str, Any]) -> list[str]:
    """The section's HTML lines (none when the report has no perf section)."""
    perf = report.get("perf")
    if not perf:
        return []
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in perf["points"]:
        by_op[p["op"]].append(p)
    body = [f"<style>{CSS}</style>", '<section class="perf" id="perf">',
            "<h2>Bandwidth (perf mode)</h2>",
            "<p class=\"meta\">busbw against message size per op; a bar spans the slowest "
            "to the fastest repeat (clipped at the top), dashed lines are in-place. Only "
            "instances whose "
            "correctness check passed are timed.</p>",
            "<ul>" + "".join(f"<li>{_e(line[2:])}</li>" for line in perf_md.facts(report))
            + "</ul>"]
    if not by_op:
        body.append("<p>No instance was timed.</p>")
    body.append('<div class="plots">' + "".join(plot(op, pts) for op, pts in
                                                sorted(by_op.items())) + "</div>")
    if by_op:
        body.append("<details><summary>Numbers (nccl-tests column order)</summary><pre>"
                    + _e("\n".join(perf_md.tables(perf["points"]))) + "</pre></details>")
    body.append("</section>")
    return body
