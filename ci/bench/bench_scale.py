"""Collection and report writing against the number of instances (issue 44 point 3).

    python ci/bench/bench_scale.py [--sizes 3300,6500,50000] [--json PATH] [--keep DIR]

Two measurements per size N, each in a fresh process whose peak resident memory the kernel
reports when it ends (``wait4``):

* collect: ``pytest --collect-only`` over generated case files holding N trivial instances
  (world size 2, one all_reduce each; 5,000 per file, the per-file limit), wall time of the
  whole command;
* report: N records built from the committed quick-suite reference report (copies with new
  keys), then the report assembled (``build_report``, its schema check) and rendered as JSON,
  Markdown and HTML, each timed; the HTML's size and element count (what a browser parses and
  lays out: the per-instance table's rows are built by its script, a page at a time).

Linear means the per-instance figures stay flat as N grows. Quoted in
docs/explanation/process-model.md ("Session cost"). A benchmark, not a test: CI does not run
it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "reports" / "reference" / "gloo-cpu-quick-torch2.13.0.json.gz"
PER_FILE = 5000

REPORT_CHILD = textwrap.dedent("""
    import copy, gzip, json, re, sys, time
    from harness.report import html, markdown
    from harness.report.records import build_report, json_text
    n, template, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    with gzip.open(template, "rt") as fh:
        base = json.load(fh)
    src = base["records"]
    records = []
    for i in range(n):
        r = copy.deepcopy(src[i % len(src)])
        r["key"] = f"{r['key']}#{i}"
        r["nodeid"] = f"{r['nodeid']}#{i}"
        records.append(r)
    t = {}
    t0 = time.perf_counter(); report = build_report(records, base["metadata"],
                                                     base.get("session"))
    t["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); text = json_text(report); t["json_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); md = markdown.render(report); t["md_s"] = time.perf_counter() - t0
    t0 = time.perf_counter(); page = html.render(report); t["html_s"] = time.perf_counter() - t0
    with open(out, "w") as fh:
        fh.write(page)
    t.update(json_bytes=len(text), md_bytes=len(md), html_bytes=len(page.encode()),
             html_elements=len(re.findall(r"<[a-zA-Z]", page)))
    print(json.dumps(t))
""")


def _run(argv: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, peak resident MiB and stdout of ``argv`` run to its end."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        out.seek(0)
        text = out.read()
    if proc.returncode not in (0, 5):
        raise RuntimeError(f"{argv[:4]} exited {proc.returncode}:\n{text[-2000:]}")
    return wall, usage.ru_maxrss / 1024, text


def case_files(folder: Path, n: int) -> None:
    """Case files under ``folder/cases`` holding ``n`` trivial instances together."""
    (folder / "cases").mkdir(parents=True, exist_ok=True)
    left, k = n, 0
    while left > 0:
        here = min(PER_FILE, left)
        (folder / "cases" / f"gen{k}.yaml").write_text(textwrap.dedent(f"""
            cases:
              - name: gen{k}
                op: all_reduce
                world_size: 2
                params: {{seq: {list(range(here))}}}
                shape: [4]
                input: "rank + i + seq"
            """))
        left -= here
        k += 1


def collect(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        case_files(folder, n)
        wall, peak, text = _run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                                 "-p", "no:cacheprovider", "cases"], folder)
    got = re.search(r"(\d+) tests? collected", text)
    if not got or int(got.group(1)) != n:
        raise RuntimeError(f"collected {got.group(1) if got else '?'} of {n}:\n{text[-800:]}")
    return {"n": n, "wall_s": wall, "peak_mib": peak, "us_per_instance": 1e6 * wall / n}


def report(n: int, keep: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as name:
        page = (keep or Path(name)) / f"scale-{n}.html"
        wall, peak, text = _run([sys.executable, "-c", REPORT_CHILD, str(n), str(TEMPLATE),
                                 str(page)], ROOT)
    figures: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    total = sum(v for k, v in figures.items() if k.endswith("_s"))
    return {"n": n, "wall_s": wall, "peak_mib": peak, "write_s": total,
            "us_per_record": 1e6 * total / n, **figures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="3300,6500,50000")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--keep", metavar="DIR", help="keep each size's HTML report in DIR")
    args = ap.parse_args()
    keep = Path(args.keep) if args.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print("| instances | collect s | us/instance | peak MiB | report write s | us/record | "
          "peak MiB | JSON MB | HTML MB | HTML elements |\n" + "|---" * 10 + "|")
    for n in (int(x) for x in args.sizes.split(",")):
        c, r = collect(n), report(n, keep)
        rows.append({"collect": c, "report": r})
        print(f"| {n:,} | {c['wall_s']:.2f} | {c['us_per_instance']:.0f} | {c['peak_mib']:.0f} | "
              f"{r['write_s']:.2f} | {r['us_per_record']:.0f} | {r['peak_mib']:.0f} | "
              f"{r['json_bytes'] / 1e6:.1f} | {r['html_bytes'] / 1e6:.2f} | "
              f"{r['html_elements']:,} |", flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
