"""The HTML report: structure, self-containment, and what a browser really shows.

The browser tests drive Debian's headless Chromium without extra Python packages: the page's
DOM after load is read with ``--dump-dom`` (a probe script appended to a copy of the page
records computed colors and element counts), and ``--screenshot`` gives a PNG whose pixels
are counted. They are skipped, with the reason, only where no Chromium is installed
(``bash ci/system-packages.sh`` installs it; CI runs that first).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import dtypes
from harness.report import html
from harness.report.records import build_report, validate_report
from tests.helpers import HANG_S
from tests.runs import Run

# -- a synthetic report covering every outcome ------------------------------------------------


def rec(case: str, op: str, dtype: str, ws: int, asy: bool | None, outcome: str,
        message: str = "", ordering: dict[str, Any] | None = None) -> dict[str, Any]:
    ident = f"gloo-ws{ws}-{dtype}" + ("" if asy is None else "-async" if asy else "-sync")
    axes: dict[str, Any] = {"world_size": ws, "dtype": dtype}
    if asy is not None:
        axes["async"] = asy
    r: dict[str, Any] = {
        "key": f"cases/x.yaml::{case}[{ident}]", "nodeid": f"cases/x.yaml::{case}[{ident}]",
        "file": "cases/x.yaml", "line": 7, "case": case, "id": ident, "description": "d",
        "backend": "gloo", "device": "cpu", "world_size": ws, "dtype": dtype, "op": op,
        "family": op, "reduce_op": None, "async": bool(asy), "axes": axes, "outcome": outcome,
        "expected": "pass", "reason": "known" if outcome == "xfail" else "",
        "message": message or f"cases/x.yaml:7: {case}[{ident}]: {outcome}",
        "duration_s": 0.01, "pool_replaced": False,
        "ranks": [{"rank": k, "status": "ok", "checks": []} for k in range(ws)]}
    if outcome == "hang":
        r["ranks"][1] = {"rank": 1, "status": "no_result", "state": "blocked", "step": 0,
                         "step_desc": "recv(tensor=t)", "stack": "File rank.py, line 9"}
    if ordering is not None:
        r["ordering"] = ordering
    return r


def synthetic() -> dict[str, Any]:
    def verdicts(post_wait: str) -> dict[str, Any]:
        ok = {"status": "ok", "detail": ""}
        return {"pre_op": ok, "post_wait": {"status": post_wait, "detail": "read right after "
                                             "wait() saw stale data"},
                "completion": ok, "host_blocking": {**ok, "observed": "returns_early"},
                "declared": {"status": "n/a", "detail": ""}, "probes": True, "delay_s": 0.02,
                "delayed_rank": 1}

    good, bad = verdicts("ok"), verdicts("violated")
    records = [
        rec("ar", "all_reduce", "float32", 2, False, "passed", ordering=good),
        rec("ar", "all_reduce", "float32", 2, True, "failed",
            "cases/x.yaml:7: ar[gloo-ws2-float32-async]: wrong values on rank(s) 1\n"
            "  rank 1, tensor 'input': 1 of 4 wrong <script>alert(1)</script>", ordering=bad),
        rec("ar", "all_reduce", "float32", 4, False, "passed"),
        rec("ar2", "all_reduce", "float32", 4, False, "xfail"),
        rec("ar", "all_reduce", "int64", 2, False, "passed"),
        rec("bc", "broadcast", "int64", 2, None, "hang"),
        rec("bc", "broadcast", "int64", 4, None, "skipped"),
        rec("sr", "send", "float32", 2, None, "passed"),
    ]
    report = build_report(records, {"torch": "2.13.0+cpu", "hostname": "h", "options": {}})
    validate_report(report)
    return report


class Dom(HTMLParser):
    """Elements as (tag, attrs, text inside) with a class helper; enough for structure tests."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[dict[str, Any]] = []
        self.stack: list[dict[str, Any]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = {"tag": tag, "attrs": {k: v or "" for k, v in attrs}, "text": ""}
        self.elements.append(el)
        if tag not in ("meta", "br", "link", "img", "input"):
            self.stack.append(el)

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()["tag"] == tag:
                break

    def handle_data(self, data: str) -> None:
        for el in self.stack:
            el["text"] += data

    def select(self, tag: str, cls: str = "") -> list[dict[str, Any]]:
        return [e for e in self.elements if e["tag"] == tag
                and (not cls or cls in e["attrs"].get("class", "").split())]


def test_grid_cells_counts_and_links() -> None:
    page = html.render(synthetic())
    dom = Dom(page)
    cells = dom.select("td", "cell")
    # (op, dtype) pairs with records: all_reduce x {float32, int64}, broadcast x int64,
    # send x float32; the other pairs of the 3 x 2 grid are empty
    assert sorted((c["attrs"]["data-op"], c["attrs"]["data-dtype"]) for c in cells) == [
        ("all_reduce", "float32"), ("all_reduce", "int64"), ("broadcast", "int64"),
        ("send", "float32")]
    assert len(dom.select("td", "empty")) == 2
    by_cell = {(c["attrs"]["data-op"], c["attrs"]["data-dtype"]): c for c in cells}
    ar = by_cell[("all_reduce", "float32")]
    # one cell per op x dtype, colored by its worst outcome, the instance count inside and
    # every outcome's count on hover
    assert ar["attrs"]["data-outcome"] == "failed" and "o-failed" in ar["attrs"]["class"]
    assert ar["text"].strip() == "4" and ar["attrs"]["data-count"] == "4"
    assert ar["attrs"]["title"] == "all_reduce \u00d7 float32: 1 failed, 1 xfail, 2 passed"
    assert by_cell[("broadcast", "int64")]["attrs"]["data-outcome"] == "hang"
    ids = {e["attrs"]["id"] for e in dom.elements if "id" in e["attrs"]}
    hrefs = [e["attrs"]["href"] for e in dom.select("a") if e["attrs"].get("href")]
    assert hrefs and all(h.startswith("#") and h[1:] in ids for h in hrefs)
    # a click on a cell opens its drill-down, whose failing instance links to the failure
    link = next(e for e in dom.select("a") if e["attrs"].get("href") == "#" + html.anchor(
        "d", "gloo", "all_reduce", "float32"))
    assert link["text"] == "4"
    drill = next(e for e in dom.select("details", "drill")
                 if e["attrs"]["id"] == html.anchor("d", "gloo", "all_reduce", "float32"))
    assert "1 failed, 1 xfail, 2 passed" in drill["text"]
    failure_id = html.anchor("f", "cases/x.yaml::ar[gloo-ws2-float32-async]")
    assert any(e["attrs"].get("href") == f"#{failure_id}" for e in dom.select("a"))
    # dtype columns are grouped: floating before integer, each group's header spans it
    groups = [(e["text"], e["attrs"]["colspan"]) for e in dom.select("th", "gs")
              if "colspan" in e["attrs"]]
    assert groups == [("floating", "1"), ("integer", "1")]
    # ops are grouped under their family rows; each family is summarized above the grid
    fams = [e["attrs"]["data-family"] for e in dom.elements if "data-family" in e["attrs"]]
    assert fams == ["all_reduce", "broadcast", "send"]


def test_dtype_groups_and_natural_order() -> None:
    assert html.dtype_groups(["int64", "bool", "float32", "bfloat16", "uint8", "complex64",
                              "object", "float8_e5m2", "mystery"]) == [
        ("floating", ["bfloat16", "float32", "float8_e5m2"]),
        ("integer", ["uint8", "int64"]),
        ("other", ["bool", "complex64", "object", "mystery"])]
    ids = ["n1000", "n1048576", "n1", "n65536"]
    assert sorted(ids, key=html.natural_key) == ["n1", "n1000", "n65536", "n1048576"]
    report = synthetic()
    base = report["records"][0]
    report["records"] = [{**base, "key": f"k{n}", "case": "sizes", "id": f"gloo-ws2-f32-n{n}"}
                         for n in (1000, 1048576, 1, 65536)]
    page = html.render(report)
    assert [m for m in re.findall(r"sizes\[gloo-ws2-f32-(n\d+)\]", page)] == [
        "n1", "n1000", "n65536", "n1048576"]


def test_heading_names_devices_that_ran() -> None:
    report = synthetic()
    skipped = {**report["records"][0], "key": "k-cuda", "device": "cuda", "outcome": "skipped",
               "reason": "needs CUDA"}
    report["records"].append(skipped)
    dom = Dom(html.render(report))
    assert dom.select("h2")[0]["text"] == "gloo on cpu (cuda: 1 skipped, none ran)"


def test_failures_detail_ordering_and_escaping() -> None:
    page = html.render(synthetic())
    dom = Dom(page)
    failures = dom.select("details", "failure")
    assert [f["attrs"]["data-key"] for f in failures] == [
        "cases/x.yaml::ar[gloo-ws2-float32-async]", "cases/x.yaml::bc[gloo-ws2-int64]"]
    assert "rank 1, tensor 'input': 1 of 4 wrong" in failures[0]["text"]
    assert "recv(tensor=t)" in failures[1]["text"] and "File rank.py" in failures[1]["text"]
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)" in page
    ordering = dom.select("table", "ordering")
    assert len(ordering) == 1
    row = next(e for e in dom.select("tr") if e["attrs"].get("data-filter-op") == "all_reduce"
               and "instances" not in e["text"] and "2" in e["text"] and "ok" in e["text"])
    assert "violated 1, ok 1" in row["text"] and "returns early x2" in row["text"]
    assert len(dom.select("td", "st-violated")) == 1
    assert len(dom.select("td", "prop-false")) == 1  # the failure's own table
    # without ordering data the section is simply absent
    plain = synthetic()
    for r in plain["records"]:
        r.pop("ordering", None)
    assert not Dom(html.render(plain)).select("table", "ordering")


def test_documented_ordering_divergence_is_not_shown_as_a_failure() -> None:
    """A violation an override documents reads "known" (as in the Markdown), never as a red
    "false" under a PASS banner."""
    report = synthetic()
    report["records"] = [r for r in report["records"] if r["outcome"] == "passed"]
    for r in report["records"]:
        if r.get("ordering"):
            r["ordering"]["completion"] = {"status": "violated", "known": "gloo completes early",
                                           "detail": ""}
    dom = Dom(html.render(report))
    assert dom.select("p", "verdict")[0]["text"].startswith("PASS")
    assert not dom.select("td", "st-violated") and not dom.select("td", "prop-false")
    assert len(dom.select("td", "st-known")) == 1
    page = html.render(report)
    assert "gloo completes early" in page and "false" not in Dom(page).select(
        "table", "ordering")[0]["text"]


def test_page_is_self_contained() -> None:
    page = html.render(synthetic())
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert "fetch(" not in page and "XMLHttpRequest" not in page


def test_plugin_writes_html_beside_json(gloo_run: Run, faulty_run: Run) -> None:
    default = gloo_run.reports / "conformance.html"
    assert default.is_file() and (gloo_run.reports / "conformance.md").is_file()
    dom = Dom(default.read_text())
    assert [t["attrs"]["data-backend"] for t in dom.select("table", "matrix")] == ["gloo"]
    assert not dom.select("details", "failure")
    chosen = faulty_run.reports / "matrix.html"  # --report-html in the faulty run
    assert chosen.is_file() and not (faulty_run.reports / "conformance.html").exists()
    assert len(Dom(chosen.read_text()).select("details", "failure")) == 5


# -- in a real browser -------------------------------------------------------------------------

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                        "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed "
                                    "(bash ci/system-packages.sh installs Debian's chromium)")
PASSED_RGB = (0x2D, 0xA4, 0x4E)
FAILED_RGB = (0xCF, 0x22, 0x2E)
PROBE = """<script>window.addEventListener('load', function () {
  var css = function (el) { return getComputedStyle(el).backgroundColor; };
  var box = function (el) { var r = el.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom]; };
  var out = {cells: [], open: [], failures: document.querySelectorAll('details.failure').length,
             legend: [], width: document.documentElement.clientWidth};
  document.querySelectorAll('table.grid td.cell').forEach(function (td) {
    out.cells.push([td.dataset.outcome, css(td), box(td)]); });
  document.querySelectorAll('details[open]').forEach(function (d) { out.open.push(d.id); });
  document.querySelectorAll('.legend .item').forEach(function (it) {
    out.legend.push([it.textContent, box(it.querySelector('.sw')), box(it)]); });
  var wrap = document.querySelector('.gridwrap');
  if (wrap) { out.wrap = box(wrap);
    var op = wrap.querySelector('th.op'), head = wrap.querySelector('tr.dtypes th');
    var before = [box(op)[0] - box(wrap)[0], box(head)[1] - box(wrap)[1]];
    wrap.scrollLeft = 200; wrap.scrollTop = 200;
    out.sticky = [before, [box(op)[0] - box(wrap)[0], box(head)[1] - box(wrap)[1]],
                  [wrap.scrollLeft, wrap.scrollTop]]; }
  var sec = document.querySelector('section.backend'), q = sec && sec.querySelector('input.q');
  if (q && window.FILTER !== undefined) { q.value = window.FILTER;
    q.dispatchEvent(new Event('input', {bubbles: true}));
    out.visible = []; sec.querySelectorAll('table.grid tbody tr').forEach(function (tr) {
      if (tr.getBoundingClientRect().height > 0) out.visible.push(
        tr.querySelector('th').textContent); }); }
  var pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre); });
</script>"""


def chromium(tmp: Path, *args: str) -> str:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def probe(page: str, tmp: Path, fragment: str = "", width: int = 1400,
          filter_text: str | None = None) -> dict[str, Any]:
    path = tmp / "probe.html"
    setup = ("" if filter_text is None else
             f"<script>window.FILTER = {json.dumps(filter_text)};</script>")
    path.write_text(page.replace("</body>", setup + PROBE + "</body>"))
    dom = chromium(tmp, "--virtual-time-budget=3000", f"--window-size={width},900",
                   "--dump-dom",
                   path.as_uri() + (f"#{fragment}" if fragment else ""))
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert match, dom[-2000:]
    data: dict[str, Any] = json.loads(unescape(match.group(1)))
    return data


def rgb(css: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", css)[:3])


@needs_chromium
def test_browser_renders_grid_colors(faulty_run: Run, tmp_path: Path) -> None:
    page = (faulty_run.reports / "matrix.html").read_text()
    data = probe(page, tmp_path)
    # the gate case file: all_reduce x {float32, int64}, broadcast x int64; world size 2
    # fails in every cell (the xfail and the skip in the float32 cell do not hide it)
    assert len(data["cells"]) == 3 and data["failures"] == 5
    assert {(o, rgb(c)) for o, c, _box in data["cells"]} == {("failed", FAILED_RGB)}
    assert all(b[2] > b[0] and b[3] > b[1] for _o, _c, b in data["cells"])
    assert data["open"] == []  # failure details start folded


def wide_report() -> dict[str, Any]:
    """Every dtype the harness knows x 30 ops: wider and taller than the bundled library."""
    records = []
    for i in range(30):
        for d in dtypes.DTYPES:
            records.append(rec(f"c{i}", f"op_with_a_long_name_{i:02d}", d, 2, None,
                               "failed" if (i + len(d)) % 7 == 0 else "passed"))
    report = build_report(records, {"torch": "2.13.0+cpu", "hostname": "h", "options": {}})
    validate_report(report)
    return report


@needs_chromium
@pytest.mark.parametrize("width", [700, 1400, 1920])
def test_grid_fits_the_screen_and_keeps_names_in_view(width: int, tmp_path: Path) -> None:
    data = probe(html.render(wide_report()), tmp_path, width=width)
    assert len(data["cells"]) == 30 * len(dtypes.DTYPES)
    if width >= 1400:
        # every cell, the object column included, is on screen without scrolling sideways
        assert max(b[2] for _o, _c, b in data["cells"]) <= data["width"]
    # scrolled inside the grid, op names and dtype headers stay where they were
    before, after, scrolled = data["sticky"]
    assert scrolled[1] > 0 and after[1] == before[1] and after[0] == before[0]
    if width < 1000:  # too narrow for every column: it scrolls sideways, names stay put
        assert scrolled[0] > 0


@needs_chromium
def test_legend_labels_sit_next_to_their_own_swatch(tmp_path: Path) -> None:
    data = probe(html.render(synthetic()), tmp_path)
    legend = data["legend"]
    assert [t for t, _s, _i in legend] == list(html.SEVERITY)
    for (_t, sw, item), (_n, next_sw, _ni) in itertools.pairwise(legend):
        label_right = item[2]
        gap_own = item[2] - sw[2]  # the label follows its swatch inside one item
        assert sw[0] == item[0] and gap_own > 0
        if next_sw[1] == sw[1]:  # same line: clearly more room before the next swatch
            assert next_sw[0] - label_right >= 12


@needs_chromium
def test_filter_box_hides_other_ops(tmp_path: Path) -> None:
    data = probe(html.render(synthetic()), tmp_path, filter_text="broad")
    assert data["visible"] == ["broadcast", "broadcast"]  # the family row and its op


@needs_chromium
def test_failure_detail_is_one_click_away(tmp_path: Path) -> None:
    """Following a failing instance's link (what a click does) opens that failure's details;
    a grid cell's link opens its drill-down."""
    page = html.render(synthetic())
    target = html.anchor("f", "cases/x.yaml::ar[gloo-ws2-float32-async]")
    assert probe(page, tmp_path, target)["open"] == [target]
    drill = html.anchor("d", "gloo", "all_reduce", "float32")
    assert probe(page, tmp_path, drill)["open"] == [drill]


def read_png(path: Path) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) to an array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, ctype, _c, _f, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0
            channels = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, width * channels + 1)
    out = np.zeros((height, width * channels), np.uint8)
    prev = np.zeros(width * channels, np.int32)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) % 256
        elif f == 1:
            cur = np.cumsum(line.reshape(width, channels), axis=0).reshape(-1) % 256
        else:  # average / Paeth depend on the pixel just decoded: a plain loop
            row = bytearray(width * channels)
            bl, up = line.tolist(), prev.tolist()
            for i in range(len(row)):
                a = row[i - channels] if i >= channels else 0
                b = up[i]
                if f == 3:
                    row[i] = (bl[i] + (a + b) // 2) & 0xFF
                else:
                    c = up[i - channels] if i >= channels else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                    row[i] = (bl[i] + pred) & 0xFF
            cur = np.frombuffer(bytes(row), np.uint8).astype(np.int32)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, channels)[:, :, :3]


def pixels_near(img: np.ndarray[Any, np.dtype[np.uint8]], color: tuple[int, ...]) -> int:
    diff = np.abs(img.astype(np.int32) - np.array(color, np.int32)).max(axis=2)
    return int((diff <= 10).sum())


@needs_chromium
def test_screenshot_shows_red_for_failures_green_for_passes(gloo_run: Run, faulty_run: Run,
                                                            tmp_path: Path) -> None:
    counts = {}
    for name, page in (("pass", gloo_run.reports / "conformance.html"),
                       ("fail", faulty_run.reports / "matrix.html")):
        shot = tmp_path / f"{name}.png"
        chromium(tmp_path, "--window-size=1000,700", f"--screenshot={shot}", page.as_uri())
        img = read_png(shot)
        assert img.shape == (700, 1000, 3)
        # The docs' picture of the report is this run's page (COLLECTIVE_DOCS_SCREENSHOT=
        # docs/img/report.png pytest tests/test_html_report.py -k screenshot): never drawn
        if name == "fail" and os.environ.get("COLLECTIVE_DOCS_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["COLLECTIVE_DOCS_SCREENSHOT"])
        counts[name] = (pixels_near(img, PASSED_RGB), pixels_near(img, FAILED_RGB))
    # both pages show green (cells and the family bars); only the failing run's grid adds red
    # cells (the legend has one red swatch on both pages)
    assert counts["pass"][0] > 1000 and counts["fail"][0] > 300
    assert counts["fail"][1] > counts["pass"][1] + 1000, counts


def test_failure_block_shows_first_wrong_element() -> None:
    report = synthetic()
    bad = next(r for r in report["records"] if r["outcome"] == "failed")
    bad["ranks"][1]["checks"] = [{"tensor": "tensor", "ok": False, "expectation": "auto",
                                  "wrong": 1, "total": 4, "digest": "",
                                  "first_wrong": [{"index": 2, "expected": "3.0",
                                                   "got": "5.0"}]}]
    dom = Dom(html.render(report))
    (shown,) = dom.select("p", "first-wrong")
    assert shown["text"] == ("first wrong: rank 1 'tensor'[2]: expected 3.0 got 5.0 "
                             "(1 of 4 wrong)")


def test_the_verdict_comes_first_then_the_grid_then_the_legend() -> None:
    """Issue 26, point 8: what a reader needs first is the answer."""
    page = html.render(synthetic())
    body = page[page.index("<body>"):]
    first = re.search(r'<p class="banner verdict run (pass|fail)">([^<]*)</p>', body)
    assert first is not None and body.index(first.group(0)) < body.index('class="meta"')
    assert first.group(2).startswith(("PASS", "FAIL", "INCOMPLETE"))
    assert body.index(first.group(0)) < body.index('<table class="grid') < body.index(
        'class="legend"')


def test_a_multi_op_program_is_shown_under_every_op_it_issues() -> None:
    # issue 26 point 7: an FSDP round trip used to appear under its first op only
    fsdp = rec("fsdp", "all_gather_into_tensor", "float32", 2, False, "failed")
    fsdp["family"] = "all_gather"
    fsdp["issued"] = [{"op": "all_gather_into_tensor", "family": "all_gather"},
                      {"op": "reduce_scatter_tensor", "family": "reduce_scatter"}]
    report = build_report([fsdp, rec("ar", "all_reduce", "float32", 2, False, "passed")],
                          {"torch": "2.13.0+cpu", "hostname": "h", "options": {}})
    validate_report(report)
    dom = Dom(html.render(report))
    cells = {(c["attrs"]["data-op"], c["attrs"]["data-dtype"]): c
             for c in dom.select("td", "cell")}
    assert set(cells) == {("all_gather_into_tensor", "float32"), ("all_reduce", "float32"),
                          ("reduce_scatter_tensor", "float32")}
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        assert cells[(op, "float32")]["attrs"]["data-outcome"] == "failed"
        assert cells[(op, "float32")]["attrs"]["data-count"] == "1"
    fams = [e["attrs"]["data-family"] for e in dom.elements if "data-family" in e["attrs"]]
    assert fams == ["all_gather", "all_reduce", "reduce_scatter"]
    # counted once where the run is summed up: one failure entry, two instances in all
    assert len(dom.select("details", "failure")) == 1
    assert report["summary"]["total"] == 2
