"""The ``collective-gate`` command (also ``python -m harness.gate``).

    collective-gate reports/conformance.json ci/baselines/gloo-cpu.json
    collective-gate reports/conformance.json ci/baselines/gloo-cpu.json --update
    collective-gate --perf reports/conformance.json ci/baselines/gloo-cpu-perf.json

Exit status: 0 when the gate passes, 1 when it fails (always when no instance of the report
ran: verdict NOTHING RAN), 2 for unusable input (with a message).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from ..report.jsonfile import printable, unwritable
from ..report.records import write_atomic
from . import baseline as bl
from . import certificate, evidence, perf, versions
from .baseline import BaselineError, Entry, Level
from .compare import (
    GateResult,
    Match,
    check_exit_status,
    check_session,
    compare,
    nothing_ran,
    render_markdown,
    render_text,
    to_json,
)
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
    p.add_argument("--certificate", metavar="CERT",
                   help="also require this certificate of the report's backend "
                        "(collective-certify's certificate.json) at --require-level")
    p.add_argument("--require-level", choices=("declared", "conforming"), default="declared",
                   help="the certificate level --certificate must reach (default declared)")
    p.add_argument("--markdown", metavar="PATH", help="also write the result as Markdown")
    p.add_argument("--json", dest="json_path", metavar="PATH",
                   help="also write the result as JSON")
    p.add_argument("--pytest-status", type=int, default=None, metavar="N",
                   help="pytest's exit status for the run that wrote REPORT: the gate fails "
                        "when it is not explained by the report (status 1 without a failing "
                        "record, or anything but 0, 1 and 5)")
    p.add_argument("--max-list", type=int, default=200, metavar="N",
                   help="list at most N instances per category, N causes for regressions "
                        "and new failures (default 200)")
    p.add_argument("--perf", action="store_true",
                   help="gate bandwidth instead: REPORT from a --perf run, BASELINE a perf "
                        "baseline; fails when busbw drops beyond the repeats' spread by more "
                        "than the baseline's threshold")
    p.add_argument("--threshold", type=float, default=None, metavar="FRACTION",
                   help="with --perf: relative drop that fails (default: the baseline's, "
                        "0.1 for a new one); with --update it is stored in the baseline")
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
    return versions.load(path, hint=" (run pytest with the collective-harness plugin first: "
                         "it writes reports/conformance.json)")


def _error(exc: Exception) -> int:
    """Print ``exc`` as the one line the user sees; the exit status for unusable input."""
    sys.stderr.write(f"collective-gate: error: {printable(exc, 2000)}\n")
    return 2


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse output paths that cannot be written before reading anything: a directory, a path
    under a regular file, a folder that is not writable."""
    outputs = [(args.markdown, "--markdown file"), (args.json_path, "--json file")]
    if args.update:
        outputs.append((args.baseline, "baseline"))
    for path, what in outputs:
        why = unwritable(path, what) if path else ""
        if why:
            raise BaselineError(why)


def _write(path: str, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as exc:  # the disk filled, the folder went away...
        raise BaselineError(f"{path}: cannot write it: {exc.strerror or exc}") from None


def _label(path: str, backends: list[str], torch: str) -> str:
    return f"{path} ({', '.join(backends) or 'no instances'}, torch {torch or '?'})"


def gate_files(report_path: str, baseline_path: str, match: Match = "auto",
               policy: dict[str, Level] | None = None,
               pytest_status: int | None = None, same_version: bool = False) -> GateResult:
    """Load both files and compare them (and the session behind the report), across versions
    when their versions differ."""
    report = _load_report(report_path)
    hint = bl.refresh_hint(baseline_path, report_path)
    base = bl.load(baseline_path, hint)
    versions = "" if same_version else across(report, base)
    res = compare(bl.entries_from_report(report), base, match, policy, versions)
    if not base.torch:
        res.notes.append("the baseline records no torch version, so it is compared as if it "
                         "came from the report's; refresh it (--update) to record one")
    res.problems += [("evidence", m) for m in evidence.problems(report)]
    check_session(res, report)
    if pytest_status is not None:
        check_exit_status(res, pytest_status, report)
    res.refresh_hint = hint
    res.report_label = _label(report_path, res.report_backends, report["metadata"]["torch"])
    res.baseline_label = _label(baseline_path, res.baseline_backends, base.torch)
    return res


def update(report_path: str, baseline_path: str, keep_missing: bool = False) -> str:
    """Write a baseline from a report; return what changed, as text for the terminal."""
    report = _load_report(report_path)
    wrong = evidence.problems(report)
    if wrong:  # a baseline records what was observed, never what a report only claims
        raise BaselineError(f"{report_path}: not written to {baseline_path}: "
                            + "; ".join(wrong))
    # Any file already there must be a usable baseline (its policy and notes are kept).
    previous = bl.load(baseline_path) if os.path.lexists(baseline_path) else None
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
    # The comment names this file's own refresh, never the bundled suite's paths.
    new.refresh = (f"the run that writes {report_path}, then "
                   + shlex.join(["collective-gate", report_path, baseline_path, "--update",
                                 *(["--keep-missing"] if keep_missing else [])]))
    try:
        bl.write(baseline_path, new)
    except OSError as exc:
        raise BaselineError(f"{baseline_path}: cannot write it: {exc.strerror or exc}") from None
    return (f"collective-gate: wrote {baseline_path}: {len(new.entries)} entries for "
            f"{', '.join(new.backends) or 'no backend'}{summary}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``collective-gate`` and ``python -m harness.gate``."""
    args = _parser().parse_args(argv)
    if args.perf:
        return perf_main(args)
    try:
        check_outputs(args)
        if args.update:
            sys.stdout.write(update(args.report, args.baseline, args.keep_missing))
            return 0
        res = gate_files(args.report, args.baseline, args.match,
                         cli_policy(args.policy, args.strict), args.pytest_status,
                         args.same_version)
        sys.stdout.write(render_text(res, args.max_list))
        certified = True
        if args.certificate:
            backends = list(_load_report(args.report).get("metadata", {}).get("backends", []))
            certified, line = certificate.check(args.certificate, args.require_level, backends)
            sys.stdout.write(line)
        if args.markdown:
            _write(args.markdown, render_markdown(res))
        if args.json_path:
            _write(args.json_path, json.dumps(to_json(res), indent=1) + "\n")
    except BaselineError as exc:
        return _error(exc)
    return 0 if res.ok and certified else 1


def perf_main(args: argparse.Namespace) -> int:
    """``collective-gate --perf``: gate (or with --update write) a perf baseline."""
    try:
        check_outputs(args)
        report = _load_report(args.report)
        if args.update:
            try:
                sys.stdout.write(perf.update(report, args.baseline, args.threshold,
                                             args.report))
            except OSError as exc:
                raise BaselineError(f"{args.baseline}: cannot write it: "
                                    f"{exc.strerror or exc}") from None
            return 0
        res = perf.compare(report, perf.load(args.baseline), args.threshold, args.report)
        # No number at all: every baseline entry "missing" (which alone does not fail) is not
        # a pass.
        why = nothing_ran(report)
        text = (f"collective-gate --perf: FAIL: {printable(why)}\n" if why
                else perf.render_text(res, args.max_list))
        sys.stdout.write(text)
        if args.markdown:  # a key holding a fence must not end the code block
            _write(args.markdown, "```\n" + text.replace("```", "'''") + "```\n")
        if args.json_path:
            doc = {**perf.to_json(res), **({"ok": False, "nothing_ran": why} if why else {})}
            _write(args.json_path, json.dumps(doc, indent=1) + "\n")
    except BaselineError as exc:
        return _error(exc)
    return 0 if res.ok and not why else 1


if __name__ == "__main__":
    sys.exit(main())
