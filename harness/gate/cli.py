"""The ``collective-gate`` command (also ``python -m harness.gate``).

    collective-gate reports/conformance.json ci/baselines/gloo-cpu.json
    collective-gate reports/conformance.json ci/baselines/gloo-cpu.json --update

Exit status: 0 when the gate passes, 1 when it fails, 2 for unusable input (with a message).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import jsonschema

from ..report.records import load_report, write_atomic
from . import baseline as bl
from .baseline import Baseline, BaselineError, Entry, Level
from .compare import GateResult, Match, compare, render_markdown, render_text, to_json
from .versions import across


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collective-gate",
        description="Compare a collective-harness report with a baseline; exit 1 on what the "
                    "baseline does not allow (regressions, new failures by default).")
    p.add_argument("report", help="JSON report written by the pytest plugin")
    p.add_argument("baseline", help="baseline JSON (ci/baselines/...)")
    p.add_argument("--update", action="store_true",
                   help="write BASELINE from REPORT instead of gating (keeps the old file's "
                        "policy and each entry's allow/note)")
    p.add_argument("--keep-missing", action="store_true",
                   help="with --update: keep baseline entries the report did not run")
    p.add_argument("--match", choices=("auto", "exact", "agnostic"), default="auto",
                   help="exact: backend + case id + axes; agnostic: case id + axes, ignoring "
                        "the backend (compare backend X with a baseline of backend Y); auto "
                        "(default): agnostic when each side has one backend and they differ")
    p.add_argument("--policy", action="append", default=[], metavar="CATEGORY=LEVEL",
                   help=f"override the baseline's policy; LEVEL is fail, warn or ok; "
                        f"categories: {', '.join(bl.CATEGORIES)}")
    p.add_argument("--same-version", action="store_true",
                   help="classify as if report and baseline came from the same torch/NCCL "
                        "versions even when their metadata differ (by default, outcomes that "
                        "differ across versions are 'changed', not regressions)")
    p.add_argument("--strict", action="store_true",
                   help="every category but unchanged/new/changed fails (missing, newly "
                        "skipped and fixed included)")
    p.add_argument("--markdown", metavar="PATH", help="also write the result as Markdown")
    p.add_argument("--json", dest="json_path", metavar="PATH",
                   help="also write the result as JSON")
    p.add_argument("--max-list", type=int, default=200, metavar="N",
                   help="list at most N instances per category (default 200)")
    return p


def cli_policy(items: Sequence[str], strict: bool) -> dict[str, Level]:
    """``--strict`` and ``--policy CAT=LEVEL`` options as a policy mapping."""
    out: dict[str, Level] = {}
    if strict:
        out.update({c: "fail" for c in ("regression", "new_failure", "missing",
                                         "newly_skipped", "fixed")})
    raw: dict[str, Any] = {}
    for item in items:
        cat, sep, level = item.partition("=")
        if not sep:
            raise BaselineError(f"--policy {item!r}: write CATEGORY=LEVEL, e.g. missing=fail")
        raw[cat.strip()] = level.strip()
    out.update(bl.parse_policy(raw, "--policy"))
    return out


def _load_report(path: str) -> dict[str, Any]:
    try:
        return load_report(path)
    except FileNotFoundError:
        raise BaselineError(f"{path}: report not found\n    hint: run pytest with the "
                            "collective-harness plugin first (it writes "
                            "reports/conformance.json)") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise BaselineError(f"{path}: not a collective-harness report: at {where}: "
                            f"{exc.message}") from None


def _label(path: str, backends: list[str], torch: str) -> str:
    return f"{path} ({', '.join(backends) or 'no instances'}, torch {torch or '?'})"


def gate_files(report_path: str, baseline_path: str, match: Match = "auto",
               policy: dict[str, Level] | None = None, same_version: bool = False
               ) -> GateResult:
    """Load both files and compare them (across versions when their versions differ)."""
    report = _load_report(report_path)
    base = bl.load(baseline_path)
    versions = "" if same_version else across(report, base)
    res = compare(bl.entries_from_report(report), base, match, policy, versions)
    if not base.torch:
        res.notes.append("the baseline records no torch version, so it is compared as if it "
                         "came from the report's; refresh it (--update) to record one")
    res.report_label = _label(report_path, res.report_backends, report["metadata"]["torch"])
    res.baseline_label = _label(baseline_path, res.baseline_backends, base.torch)
    return res


def update(report_path: str, baseline_path: str, keep_missing: bool = False) -> str:
    """Write a baseline from a report; return what changed, as text for the terminal."""
    report = _load_report(report_path)
    previous: Baseline | None = None
    try:
        previous = bl.load(baseline_path)
    except BaselineError as exc:
        if "not found" not in str(exc):
            raise
    entries = bl.entries_from_report(report)
    keep: list[Entry] = []
    summary = ""
    if previous is not None:
        res = compare(entries, previous, "auto")
        counts = ", ".join(f"{n} {c}" for c, n in res.counts().items() if n)
        summary = f" (versus the previous baseline: {counts})"
        if keep_missing:
            have = {e.identity(True) for e in entries}
            keep = [e for e in previous.entries if e.identity(True) not in have]
    new = bl.from_report(report, previous, keep)
    bl.write(baseline_path, new)
    return (f"collective-gate: wrote {baseline_path}: {len(new.entries)} entries for "
            f"{', '.join(new.backends) or 'no backend'}{summary}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``collective-gate`` and ``python -m harness.gate``."""
    args = _parser().parse_args(argv)
    try:
        if args.update:
            sys.stdout.write(update(args.report, args.baseline, args.keep_missing))
            return 0
        res = gate_files(args.report, args.baseline, args.match,
                         cli_policy(args.policy, args.strict), args.same_version)
    except BaselineError as exc:
        sys.stderr.write(f"collective-gate: error: {exc}\n")
        return 2
    sys.stdout.write(render_text(res, args.max_list))
    if args.markdown:
        write_atomic(args.markdown, render_markdown(res))
    if args.json_path:
        write_atomic(args.json_path, json.dumps(to_json(res), indent=1) + "\n")
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
