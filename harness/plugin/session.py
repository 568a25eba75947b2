"""The session: start-up, how it ended, the report files and the gate against a baseline.

The report's ``session`` block says whether every collected instance has a record and why the
session ended (an incomplete session is never PASS); the reports are written as one set by
the controller only; with ``--baseline`` the exit status follows the gate's verdict. A
``--backend`` that names no backend is a usage error at start-up, and a session of case files
in which no instance ran (NOTHING RAN) exits 5, as pytest does when it collects nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import signal
import sys
from collections import Counter
from typing import Any
from xml.sax.saxutils import quoteattr

import pytest

from .. import ops
from ..gate import baseline, compare, versions
from ..model import BAD_OUTCOMES
from ..report import headline, html, markdown
from ..report import paths as report_paths_mod
from ..report.jsonfile import unwritable
from ..report.junitfile import add_session_error
from ..report.records import build_report, json_text, write_all
from ..run.capabilities import probe
from ..run.torchfacts import BUILTIN_BACKENDS, ProbeError
from ..verdict import deaths
from . import warmup
from .state import (
    BASELINE_KEY,
    CONFIG,
    GATE_KEY,
    INFO_KEY,
    MAX_MISSING_LISTED,
    SESSION_KEY,
    VERDICT_KEY,
    WRITTEN_KEY,
    HarnessSession,
    harness_session,
)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[SESSION_KEY] = HarnessSession(config)
    check_report_paths(config)
    try:
        # A bad ordering or perf setting is a usage error now, not per instance.
        harness_session(config).read_settings()
        load_baseline(config)
        check_backend(config, harness_session(config))
    except pytest.UsageError as exc:
        # A harness option is wrong, so this was meant to be a harness run: an earlier
        # report must not be taken for its result (a script that ignores the exit status).
        first = str(exc).splitlines()[0] if str(exc) else "?"
        mark_started(config, harness_session(config), f"did not start: usage error: {first}")
        raise
    config.addinivalue_line("markers", "collective: a collective-harness case instance")
    config.addinivalue_line("markers", "full: part of the long matrix (run with --full)")
    for name in sorted({*ops.ALL_OPS, *(op.family for op in ops.ALL_OPS.values())}):
        config.addinivalue_line("markers", f"{name}: instances of the {name} op/family")
    config.addinivalue_line("markers", "perf: a bandwidth sweep (run only with --perf)")
    for extra in ("seeds", "errors", "ordering", "subgroups", "isolated", "slow"):
        config.addinivalue_line("markers", f"{extra}: collective-harness case tag")
    if (signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
            and not hasattr(config, "workerinput")):
        # Turn SIGTERM into a normal exit so pools are torn down (ranks would also notice the
        # parent's death on their own, within a fraction of a second). Put back at unconfigure:
        # a session run inside another program (pytest.main) leaves its handlers as found.
        signal.signal(signal.SIGTERM, _sigterm)
        config.add_cleanup(_default_sigterm)
    warmup.start(config, harness_session(config), named=True)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _default_sigterm() -> None:
    if signal.getsignal(signal.SIGTERM) is _sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def check_backend(config: pytest.Config, hs: HarnessSession) -> None:
    """A ``--backend`` that torch neither has built in nor has registered (by a
    ``--backend-module`` or a torch plugin's entry point) is a usage error naming the nearest
    known name, before any rank starts: not a session in which every instance is skipped.
    A built-in name costs nothing; another costs the capability probe, whose answer the
    session's skip checks then reuse. Checked once, by the process that reports (not by
    xdist workers); a probe that fails leaves the records to say why."""
    if (hs.backend in BUILTIN_BACKENDS or hs.is_worker
            or getattr(config.option, "help", False)):
        return
    try:
        why = probe(hs.backend_modules).unknown_backend(hs.backend, hs.backend_modules)
    except ProbeError:
        return
    if why:
        raise pytest.UsageError(f"--backend {why}")


def pytest_unconfigure(config: pytest.Config) -> None:
    hs = config.stash.get(SESSION_KEY, None)
    if hs is not None:
        hs.close()  # usually a no-op: pytest_sessionfinish closed it and said how that went
    word, line = config.stash.get(VERDICT_KEY, ("", ""))
    junit = junit_path(config)
    if word == headline.NOTHING_RAN and junit:
        # pytest wrote its file in its own pytest_sessionfinish, all skipped or empty (green
        # in a CI's test view): one test case in error says that nothing ran.
        add_session_error(junit, line)


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    config = CONFIG.get("config")
    if config is not None:
        value = excinfo.value
        # pytest stops for collection errors by raising Session.Interrupted, a
        # KeyboardInterrupt: say which it was, not "Ctrl-C".
        harness_session(config).ended_by = stop_reason(value)


def stop_reason(value: BaseException) -> str:
    """Why pytest stopped, from the KeyboardInterrupt it raised: pytest's own Interrupted
    (a collection error), pytest-xdist's (``-x`` / ``--maxfail`` under ``-n``: "stopping
    after N failures"), SIGTERM (raised as KeyboardInterrupt("SIGTERM")), or Ctrl-C."""
    text = str(value)
    if text == "SIGTERM":
        return "terminated (SIGTERM)"
    if text.startswith("stopping after"):
        return f"stopped early: {text} (-x / --maxfail)"
    if isinstance(value, pytest.Session.Interrupted):
        return f"stopped by pytest: {text}"
    if type(value) is not KeyboardInterrupt and text:  # a plugin's own Interrupted
        return f"stopped by {type(value).__module__.split('.')[0]}: {text}"
    return "interrupted (Ctrl-C / KeyboardInterrupt)"


def pytest_internalerror(excrepr: Any, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    config = CONFIG.get("config")
    if config is not None:
        text = f"internal error in pytest: {excinfo.typename}: {excinfo.value}"
        harness_session(config).ended_by = text[:300]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    CONFIG["config"] = session.config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    hs = harness_session(session.config)
    if hs.saw_case_file:
        drop_idle_hypothesis(session.config)
    hs.close_failure = hs.close()
    if hs.close_failure:
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
    if hs.is_worker:
        return
    base = session.config.stash.get(BASELINE_KEY, None)
    config = session.config
    if config.option.collectonly:
        return
    info = session_info(session, hs, int(exitstatus))
    config.stash[INFO_KEY] = info
    if ((hs.records or hs.collected or hs.started_report)
            and not config.getoption("collective_no_report")):
        write_reports(config, hs, info)
        if hs.fallback and session.exitstatus == pytest.ExitCode.OK:
            # The report is not where the caller will look for it: not a clean run.
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    word = "PASS"
    if hs.records or hs.collected or hs.started_report or hs.saw_case_file:
        summary = {**Counter(r["outcome"] for r in hs.records), "total": len(hs.records)}
        word = headline.verdict(summary, info)
        config.stash[VERDICT_KEY] = (word, headline.headline(summary, info))
    if word == headline.NOTHING_RAN and session.exitstatus == pytest.ExitCode.OK:
        # Every instance skipped: pytest says 0, but a run that judged nothing passed nothing.
        # 5 is pytest's own "no tests collected", which a session that selected none gets.
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
    if base is not None:
        gate_session(session, hs, base, info)
    elif session.exitstatus == pytest.ExitCode.OK and word != "PASS":
        # pytest exits 0 on a non-strict xpass; the report says FAIL, and a script or CI job
        # that reads only the exit status must not see a pass the report does not give.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


HYPOTHESIS_PLUGIN = "hypothesispytest"  # Hypothesis's pytest11 entry point


def drop_idle_hypothesis(config: pytest.Config) -> None:
    """Unregister Hypothesis's pytest plugin when nothing in this session imported
    Hypothesis (a core dependency, so its plugin is in every session). The plugin's terminal
    summary imports ``hypothesis`` whether or not a test used it, to list the observation
    files its tests wrote: 0.7 s of every harness session's end (1 s with pytest's assertion
    rewriting of it), to print nothing. With Hypothesis never imported there is nothing it
    could print, except an empty statistics section that ``--hypothesis-show-statistics``
    asks for: then it stays."""
    if "hypothesis" in sys.modules or config.getoption("hypothesis_show_statistics", False):
        return
    plugin = config.pluginmanager.get_plugin(HYPOTHESIS_PLUGIN)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)


def session_info(session: pytest.Session, hs: HarnessSession, exitstatus: int
                 ) -> dict[str, Any]:
    """Whether every collected instance has a record, why the session ended, what was
    selected: the report's ``session`` block (an incomplete session is never PASS)."""
    have = {r["nodeid"] for r in hs.records}
    missing = sorted(hs.collected - have)
    ended = hs.ended_by
    if not ended and session.shouldstop:
        ended = f"stopped early: {session.shouldstop} (-x / --maxfail)"
    if not ended and session.shouldfail:
        ended = f"stopped: {session.shouldfail}"
    if not ended and exitstatus == pytest.ExitCode.INTERRUPTED:
        ended = "interrupted"
    if not ended and missing:
        ended = (f"finished, but {len(missing)} collected instance(s) produced no record "
                 "(a harness bug or a lost worker)")
    if hs.close_failure:
        # The records stand (each was judged before), but a session whose ranks could not
        # be stopped as planned is not a clean run: never complete, never PASS.
        ended = (f"{ended or 'finished'}; then a harness error while stopping the ranks: "
                 f"{hs.close_failure}")[:600]
    # A session that pytest stopped (a collection error, Ctrl-C, an internal error) is not
    # complete even when every instance it collected has a record: it did not collect them
    # all, and a report of what it got must not read as the whole run.
    stopped = bool(hs.ended_by or hs.close_failure) or exitstatus in (
        pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
    bad_records = sum(r["outcome"] in BAD_OUTCOMES for r in hs.records)
    opt = session.config.option
    chosen = {**selection(session.config, hs), "deselected": hs.deselected,
              "deselected_full": hs.deselected_full, "deselected_perf": hs.deselected_perf,
              "deselected_world_size": hs.deselected_world_size,
              "deselected_items": hs.deselected_items,
              "last_failed": bool(getattr(opt, "lf", False)),
              "node_ids": any("::" in str(a) for a in session.config.args)}
    return {
        "complete": not missing and not stopped,
        "collected": len(hs.collected | have),
        "without_result": len(missing),
        "missing": missing[:MAX_MISSING_LISTED],
        "ended_by": ended or "finished",
        "pytest_exit_status": exitstatus,
        "pytest_failures": int(session.testsfailed),
        "unexplained_failures": max(0, int(session.testsfailed) - bad_records),
        "selection": chosen,
    }


def selection(config: pytest.Config, hs: HarnessSession) -> dict[str, Any]:
    """What the person selected (-k, -m, --world-size, --full): the start report and the
    final one state it alike."""
    opt = config.option
    return {"keyword": getattr(opt, "keyword", "") or None,
            "markexpr": getattr(opt, "markexpr", "") or None,
            "world_sizes": sorted(hs.world_sizes) if hs.world_sizes else None,
            "full": hs.full}


def session_report(hs: HarnessSession, info: dict[str, Any] | None = None) -> dict[str, Any]:

    meta: dict[str, Any] = {"torch": "", "hostname": ""}
    if hs.records:
        with contextlib.suppress(ProbeError):  # then every record is an error saying why
            meta = probe(hs.backend_modules).metadata()
    meta["options"] = hs.options()
    return build_report(hs.records, meta, info)


def mark_started(config: pytest.Config, hs: HarnessSession, ended_by: str = "") -> None:
    """Replace the report files at once by an INCOMPLETE report naming this session.

    Called when the first case file is collected (on the xdist controller, when a worker
    reports case instances), so that a run killed by SIGKILL, or stopped before its final
    write, can never leave an earlier run's report, PASS or not, to be taken for its own; the
    final write replaces it. Sessions without case files (a project's own tests) and
    ``--collect-only`` / ``--no-report`` leave the files alone."""
    if (hs.started_report or hs.is_worker or config.option.collectonly
            or config.getoption("collective_no_report")):
        return
    hs.started_report = True
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    info = {"complete": False, "collected": 0, "without_result": 0, "missing": [],
            "ended_by": ended_by[:300] or (
                f"started at {started_at} (pid {os.getpid()}) and not finished: still "
                "running, or ended without writing its report (killed?)"),
            "selection": {**selection(config, hs), "args": list(config.args)}}
    # ``ended_by``: the options are the usage error's subject, not read back into the report.
    options = {"backend": hs.backend} if ended_by else hs.options()
    meta: dict[str, Any] = {"torch": "", "hostname": "", "options": options}
    write_report_set(config, build_report([], meta, info))
    junit = junit_path(config)
    if junit:
        # pytest writes --junitxml only at the end; until then an earlier run's file (all
        # green) must not stand there either.
        why = quoteattr(f"INCOMPLETE: {info['ended_by']}")
        try:
            write_all([(junit, '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite'
                        ' name="collective-harness" errors="1" failures="0" skipped="0" '
                        'tests="1"><testcase classname="collective-harness" name="session">'
                        f'<error message={why}/></testcase></testsuite></testsuites>\n')])
        except OSError:  # pytest's own write will fail too; at least no earlier file stands
            with contextlib.suppress(OSError):
                os.unlink(junit)


def junit_path(config: pytest.Config) -> str:
    """The --junitxml file as pytest resolves it ("" without one)."""
    xml = getattr(config.option, "xmlpath", None)
    return os.path.normpath(os.path.abspath(os.path.expanduser(os.path.expandvars(xml)))
                            ) if xml else ""


def report_paths(config: pytest.Config) -> list[str]:
    """The JSON, Markdown and HTML report paths of this session. A relative path given on the
    command line is relative to the current folder (as ``--junitxml`` is); one from the ini
    file, or the default, to the ini file's folder (the project's root), and to the current
    folder where there is no ini file: pytest's rootdir is then the common folder of the paths
    it was given, and cases named from elsewhere would write their reports beside them."""
    here = config.invocation_params.dir
    out = []
    for kind in ("json", "md", "html"):
        given = config.getoption(f"collective_report_{kind}")
        base = here if given or config.inipath is None else config.rootpath
        out.append(str(base / (given or str(config.getini(f"collective_report_{kind}")))))
    return out


def check_report_paths(config: pytest.Config) -> None:
    """At start-up: a report path that cannot be written is a usage error, before any rank
    starts (not a run whose records are lost at its end)."""
    if (hasattr(config, "workerinput") or config.option.collectonly
            or config.getoption("collective_no_report")):
        return
    flags = ["--report-json", "--report-md", "--report-html", "--junitxml"]
    for flag, path in zip(flags, [*report_paths(config), junit_path(config)], strict=True):
        why = unwritable(os.path.relpath(path), "report") if path else ""
        if why:
            raise pytest.UsageError(f"{flag} {why}; give another path with {flag}"
                                    f"{'' if flag == '--junitxml' else ' (or --no-report)'}")


def write_report_set(config: pytest.Config, report: dict[str, Any]) -> list[str]:
    """Render the three reports, then replace the files together (they never disagree). If
    the paths stopped working during the run, the set goes to a new private folder instead,
    and the returned paths (and a warning) say where: the records are never lost."""
    paths = report_paths(config)
    moved = report_paths_mod.write_set(
        paths, [json_text(report), markdown.render(report), html.render(report)])
    harness_session(config).fallback = "" if moved is None else (
        f"collective-harness: could not write the report to {os.path.relpath(paths[0])} "
        f"({moved.why}); it was written to {moved.folder} instead")
    return paths if moved is None else moved.paths


def write_reports(config: pytest.Config, hs: HarnessSession,
                  info: dict[str, Any] | None = None) -> None:
    """Write the JSON, Markdown and HTML reports (controller only), as one set: all three
    are rendered first and replaced together, so they never disagree."""

    report = session_report(hs, info)
    paths = write_report_set(config, report)
    shown = [os.path.relpath(p) for p in paths]
    # Printed in the terminal summary, on lines of their own (after -q's progress dots too).
    detected = deaths.detection_line(report["records"])
    config.stash[WRITTEN_KEY] = (f"collective-harness: {report['summary']['headline']}\n"
                              + (f"collective-harness: {detected}\n" if detected else "")
                              + "collective-harness: report written to "
                              f"{', '.join(shown[:-1])} and {shown[-1]}")


def load_baseline(config: pytest.Config) -> None:
    """Read --baseline at start-up, so a wrong path fails before any rank starts."""
    path = config.getoption("collective_baseline") or str(config.getini("collective_baseline"))
    if not path or hasattr(config, "workerinput"):
        return
    try:
        base = baseline.load(str(config.rootpath / path), session_refresh_hint(config, path))
        base.path = path  # shown as the user wrote it
        config.stash[BASELINE_KEY] = base
    except baseline.BaselineError as exc:
        raise pytest.UsageError(f"--baseline: {exc}") from None


def session_refresh_hint(config: pytest.Config, path: str) -> str:
    """The commands that (re)create the baseline ``path`` from the paths this run was given."""
    report = (config.getoption("collective_report_json")
              or str(config.getini("collective_report_json")))
    return baseline.refresh_hint(path, report, shlex.join(["pytest", *rerun_args(config)]))


def rerun_args(config: pytest.Config) -> list[str]:
    """This session's own command-line arguments (paths, -o, --max-world-size, -k, ...), less
    the baseline options, so a printed command collects what this session collected."""
    out: list[str] = []
    skip_next = False
    for arg in config.invocation_params.args:
        if skip_next:
            skip_next = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--baseline", "--baseline-match"):
            skip_next = "=" not in arg
            continue
        out.append(arg)
    return out


def gate_session(session: pytest.Session, hs: HarnessSession, base: Any,
                  info: dict[str, Any]) -> None:
    """Classify this session's instances against the baseline and set the exit status from
    the verdict: regressions fail the session even when every test "passed" (a skip, a
    missing instance under a strict policy), and failures the baseline records as known do
    not, as long as nothing else failed."""
    config = session.config
    report = session_report(hs, info)
    res = compare.compare(baseline.entries_from_report(report), base,
                          config.getoption("collective_baseline_match"),
                          across_versions=versions.across(report, base))
    compare.check_session(res, report)
    res.report_label = f"of this session ({', '.join(res.report_backends) or 'no instances'})"
    res.baseline_label = f"{base.path} ({', '.join(base.backends)}, torch {base.torch or '?'})"
    res.refresh_hint = session_refresh_hint(config, base.path)
    config.stash[GATE_KEY] = res
    known = sum(r["outcome"] in BAD_OUTCOMES for r in hs.records)
    if not res.ok and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif (res.ok and session.exitstatus == pytest.ExitCode.TESTS_FAILED
          and session.testsfailed == known and info["complete"]):
        # Every pytest failure is a record the baseline knows: the gate's verdict stands.
        session.exitstatus = pytest.ExitCode.OK
