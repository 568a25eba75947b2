"""Runs a case set through the pytest plugin once faithful and once per fault; compares records.

Every run is an ordinary pytest session (``python -m pytest PATHS --backend-module
harness.mutate.backend --backend mutant``) with the fault named in ``COLLECTIVE_MUTANT`` and
its report written to a temporary folder, so the instances, their verdicts and every option
are the plugin's own. The fault sessions run only the instances that passed on the faithful
wrapper (the others are ``--deselect``-ed) and stop at the first one that does not pass
(``-x``), which is the kill; a fault that survives runs them all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model import BAD_OUTCOMES as BAD
from ..report.jsonfile import UnreadableFile
from ..report.records import load_report
from .faults import BACKEND, BACKEND_MODULE, ENV, FAITHFUL, describe

TAIL_CHARS = 2000


@dataclass
class Options:
    """What to run: the case paths and the pytest selection shared by every session."""

    paths: list[str]
    keyword: str = ""
    full: bool = False
    deadline: float | None = None
    jobs: int = 1
    stop_at_first_kill: bool = True
    extra: list[str] = field(default_factory=list)  # more pytest arguments, verbatim


@dataclass
class Session:
    """What one pytest session reported: records by node id, exit status, time, output tail."""

    fault: str
    records: dict[str, dict[str, Any]]
    returncode: int
    duration_s: float
    tail: str


@dataclass
class FaultResult:
    """The verdict on one fault."""

    name: str
    does: str
    status: str  # killed | survived | inconclusive
    killed_by: list[dict[str, str]]
    instances_run: int
    duration_s: float
    detail: str = ""


def _command(opts: Options, report: Path, deselect: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *opts.paths, "-q", "-p", "no:cacheprovider",
           "--backend-module", BACKEND_MODULE, "--backend", BACKEND,
           "--report-json", str(report), "--report-md", str(report.with_suffix(".md")),
           "--report-html", str(report.with_suffix(".html")), "-o", "collective_baseline="]
    if opts.keyword:
        cmd += ["-k", opts.keyword]
    if opts.full:
        cmd.append("--full")
    if opts.deadline is not None:
        cmd += ["--deadline", str(opts.deadline)]
    for nodeid in deselect:
        cmd += ["--deselect", nodeid]
    return cmd + opts.extra


def run_session(opts: Options, fault: str, workdir: Path, deselect: list[str],
                stop: bool) -> Session:
    """One pytest session with ``fault`` injected; its records keyed by node id."""
    report = workdir / f"{fault}.json"
    cmd = _command(opts, report, deselect) + (["-x"] if stop else [])
    env = {**os.environ, ENV: fault}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    records: dict[str, dict[str, Any]] = {}
    if report.exists():
        try:
            doc = load_report(str(report))
        except UnreadableFile:
            doc = {"records": []}  # no records: the fault is inconclusive, never survived
        for rec in doc["records"]:
            records[rec["nodeid"]] = rec
    tail = (proc.stdout + proc.stderr)[-TAIL_CHARS:]
    return Session(fault, records, proc.returncode, round(took, 1), tail)


def judge_fault(name: str, faithful_passed: set[str], session: Session) -> FaultResult:
    """Killed if an instance that passed faithfully did not pass; survived only if every such
    instance ran and passed; otherwise inconclusive (the session did not finish)."""
    kills = [{"nodeid": nid, "outcome": rec["outcome"],
              "message": str(rec.get("message", ""))[:300]}
             for nid, rec in sorted(session.records.items())
             if nid in faithful_passed and rec["outcome"] in BAD]
    ran = len(set(session.records) & faithful_passed)
    if kills:
        return FaultResult(name, describe(name), "killed", kills, ran, session.duration_s)
    others = Counter(rec["outcome"] for nid, rec in session.records.items()
                     if nid in faithful_passed and rec["outcome"] != "passed")
    missing = len(faithful_passed - set(session.records))
    if missing or others or session.returncode not in (0, 1):
        why = (f"{missing} faithful-passing instance(s) did not run"
               + (f"; outcomes {dict(others)}" if others else "")
               + f"; pytest exited {session.returncode}: " + session.tail[-600:])
        return FaultResult(name, describe(name), "inconclusive", [], ran, session.duration_s,
                           why)
    return FaultResult(name, describe(name), "survived", [], ran, session.duration_s)


@dataclass
class Outcome:
    """The whole run: the faithful session's summary and one result per fault."""

    faithful: dict[str, Any]
    results: list[FaultResult]
    duration_s: float


def mutate(opts: Options, faults: list[str],
           progress: Callable[[str], None] = lambda s: None) -> Outcome:
    """Run the faithful session, then every fault over the instances it passed."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="collective-mutate-") as tmp:
        work = Path(tmp)
        base = run_session(opts, FAITHFUL, work, [], stop=False)
        passed = {n for n, r in base.records.items() if r["outcome"] == "passed"}
        counts = Counter(r["outcome"] for r in base.records.values())
        faithful = {"instances": len(base.records), "passed": len(passed),
                    "outcomes": dict(sorted(counts.items())), "duration_s": base.duration_s,
                    "returncode": base.returncode}
        progress(f"faithful wrapper: {len(passed)} of {len(base.records)} instance(s) pass "
                 f"({base.duration_s:.0f} s)")
        if not passed:
            faithful["tail"] = base.tail
            return Outcome(faithful, [], round(time.monotonic() - t0, 1))
        deselect = sorted(set(base.records) - passed)

        def one(fault: str) -> FaultResult:
            s = run_session(opts, fault, work, deselect, stop=opts.stop_at_first_kill)
            res = judge_fault(fault, passed, s)
            progress(f"{res.status:<12} {fault} ({res.duration_s:.0f} s)")
            return res

        with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
            results = list(pool.map(one, faults))
    return Outcome(faithful, results, round(time.monotonic() - t0, 1))
