"""Summarize a ci/gpu-check.sh output folder: one line per part, summary.md and summary.json.

Reads ``parts.tsv`` (name, exit status, seconds, report path or "-", the budget) that the
script appends to as each part ends, each part's JSON report, ``env.json`` and
``probes.json``. A part is ``ok`` only when its command exited 0 and its report is complete
and says PASS; a part that ran past its budget is ``timeout``; a part whose instances all
skipped says so (it verified nothing). Part (d), the cases written for NCCL and CUDA that had
never run, is derived from the reports of (a) and (b): their instances from cuda.yaml,
sparse.yaml and upstream.yaml.

    python ci/gpu/gpu_summary.py OUT_DIR           # prints the lines, writes summary.{md,json}
    python ci/gpu/gpu_summary.py OUT_DIR --expect  # also exit 1 if a file a run writes is missing
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

OUTCOMES = ("passed", "failed", "error", "hang", "crash", "xfail", "xpass", "limitation",
            "skipped")
NEVER_RUN_FILES = ("cuda.yaml", "sparse.yaml", "upstream.yaml")
# What every run writes, dry or not (the check of the dry-run mode reads this list).
EXPECTED_FILES = ("env.json", "parts.tsv", "probes.json", "record.json", "summary.md",
                  "summary.json")


def _esc(text: str) -> str:
    """A report's string made safe for one terminal line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def counts(records: list[dict[str, Any]]) -> dict[str, int]:
    c = collections.Counter(str(r.get("outcome")) for r in records)
    return {k: c[k] for k in OUTCOMES if c[k]}


def part_line(name: str, rc: int, secs: float, budget: float,
              report: dict[str, Any] | None) -> dict[str, Any]:
    """The summary of one part: its status and the figures it rests on."""
    row: dict[str, Any] = {"part": name, "exit": rc, "seconds": secs, "budget_s": budget}
    if rc in (124, 137):
        row["status"] = "timeout"
    if report is None:
        row.setdefault("status", "ok" if rc == 0 else "failed")
        return row
    records = report.get("records") or []
    summary = report.get("summary") or {}
    session = report.get("session") or {}
    row["instances"] = len(records)
    row["outcomes"] = counts(records)
    row["verdict"] = summary.get("verdict")
    row["headline"] = _esc(summary.get("headline", ""))
    ran = len(records) - row["outcomes"].get("skipped", 0)
    if "status" in row:
        pass
    elif not session.get("complete"):
        row["status"] = "incomplete"
    elif records and ran == 0:
        row["status"] = "all skipped"
    else:
        row["status"] = "ok" if rc == 0 and summary.get("verdict") == "PASS" else "failed"
    bad = [r for r in records if r.get("outcome") in ("failed", "error", "hang", "crash",
                                                      "xpass")]
    row["unexpected"] = [f"{r.get('nodeid')}: {r.get('outcome')}" for r in bad][:50]
    perf = report.get("perf") or {}
    if perf.get("points"):
        best: dict[str, float] = {}
        for p in perf["points"]:
            key = f"{p['backend']}/{p['device']}/{p['op']}/ws{p['world_size']}/{p['dtype']}"
            best[key] = max(best.get(key, 0.0), float(p.get("algbw_gbs") or 0.0))
        row["perf_max_algbw_gbs"] = best
        row["perf_not_timed"] = len(perf.get("not_timed") or [])
    return row


def never_run(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Part (d): the NCCL/CUDA instances of the files that had never run on a GPU."""
    per_file: dict[str, collections.Counter[str]] = {}
    for part in ("nccl-ws1", "gloo-cuda"):
        for r in (reports.get(part) or {}).get("records") or []:
            f = Path(str(r.get("file", ""))).name
            if f in NEVER_RUN_FILES and (r.get("backend") == "nccl" or r.get("device") == "cuda"):
                per_file.setdefault(f, collections.Counter())[str(r.get("outcome"))] += 1
    return {f: dict(c) for f, c in sorted(per_file.items())}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    out = Path(argv[0])
    rows: list[dict[str, Any]] = []
    reports: dict[str, dict[str, Any]] = {}
    tsv = out / "parts.tsv"
    for line in (tsv.read_text(encoding="utf-8").splitlines() if tsv.exists() else []):
        name, rc, secs, rep, budget = line.split("\t")
        report = load(out / rep) if rep != "-" else None
        if report is not None:
            reports[name] = report
        row = part_line(name, int(rc), float(secs), float(budget), report)
        if rep != "-" and report is None:
            row["status"] = "timeout" if int(rc) in (124, 137) else "no report"
        rows.append(row)
    env = load(out / "env.json") or {}
    probes = load(out / "probes.json") or {}
    recording = load(out / "record.json") or {}
    summary = {"env": env, "parts": rows, "never_run_cases": never_run(reports),
               "probes": probes, "record": recording}
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    lines = [f"# GPU check: {_esc(env.get('device', '?'))}", "",
             f"torch {_esc(env.get('torch', '?'))}, CUDA {_esc(env.get('cuda', '?'))}, "
             f"NCCL {_esc(env.get('nccl', '?'))}, driver {_esc(env.get('driver', '?'))}"
             + (" (dry run: no GPU)" if env.get("dry_run") else ""), "",
             "| part | status | seconds | instances | outcomes |", "|---|---|---|---|---|"]
    for r in rows:
        oc = ", ".join(f"{k} {v}" for k, v in (r.get("outcomes") or {}).items())
        lines.append(f"| {r['part']} | {r['status']} | {r['seconds']:.0f} / {r['budget_s']:.0f}"
                     f" | {r.get('instances', '-')} | {oc} |")
        print(f"gpu-check: {r['part']}: {r['status']} ({r['seconds']:.0f} s"
              + (f"; {r['headline']}" if r.get("headline") else "") + ")")
    nr = summary["never_run_cases"]
    lines += ["", "Cases written for NCCL/CUDA that had never run (from the parts above):", ""]
    lines += [f"- {f}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
              for f, c in nr.items()] or ["- none collected"]
    lines += ["", "Host blocking (ci/gpu/gpu_probes.py):", "", "```",
              json.dumps(probes, indent=1), "```"]
    lines += ["", "A CUDA DDP run recorded and replayed (ci/gpu/record_ddp.py, then the part "
              "replay-nccl):", "", "```", json.dumps(recording, indent=1), "```"]
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if "--expect" in argv[1:]:
        missing = [f for f in EXPECTED_FILES if not (out / f).is_file()]
        missing += [f"{r['part']}: its report" for r in rows if r["status"] == "no report"]
        if missing:
            print(f"gpu-check: missing from {out}: {', '.join(missing)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
