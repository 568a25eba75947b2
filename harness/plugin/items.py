"""Items: one case instance set up (overrides, capabilities), run on a rank pool and judged.

Every collected instance ends with exactly one record, attached to pytest's report so that it
travels from xdist workers to the controller: a harness bug or another plugin's failure is an
``error`` record, never a missing one.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ..model import BAD_OUTCOMES, Instance, InstanceResult
from ..report.oneline import one_line
from ..report.records import instance_record, skipped_record
from ..run.torchfacts import ProbeError
from ..runner.execute import internal_error
from ..runner.prepare import Prepared
from .state import (
    CONFIG,
    OUTCOME_ATTR,
    RECORD_ATTR,
    HarnessSession,
    harness_session,
)


class CaseFailure(Exception):
    """Raised by an item whose instance did not meet its expectation."""

    def __init__(self, result: InstanceResult) -> None:
        self.result = result
        super().__init__(result.message)


class CaseItem(pytest.Item):
    """One instance of a case."""

    def __init__(self, *, instance: Instance, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.instance = instance
        self.record: dict[str, Any] | None = None
        self.result: InstanceResult | None = None
        self.harness_failure: InstanceResult | None = None
        self.prepared: Prepared | None = None
        self.add_marker("collective")
        for mark in instance.marks:
            self.add_marker(mark)
        if instance.isolate:
            self.add_marker("isolated")
        for key, value in (("backend", instance.backend), ("world_size", instance.world_size),
                           ("dtype", instance.dtype), ("op", instance.op),
                           ("yaml", f"{instance.file}:{instance.line}")):
            self.user_properties.append((key, value))

    def pool_key(self) -> tuple[Any, ...]:
        """What the session sorts its instances by, so that the instances of one pool are
        together: everything of :func:`harness.runner.prepare.pool_key` that comes from the
        instance. Without the environment, process-group timeout and device binding a case
        sets, its instances fell between others of the same world size, and the pools kept
        (two by default, the least recently used closed first) were closed by them and
        started again: five more pool starts over the bundled library, each several seconds
        on a backend whose ranks start a worker interpreter (torchft's BabyGloo)."""
        inst = self.instance
        return (inst.backend, inst.device, inst.world_size, inst.isolate, inst.env,
                inst.pg_timeout is not None, inst.pg_timeout or 0.0, inst.bind_device)

    def setup(self) -> None:

        try:
            self._setup()
        except pytest.skip.Exception:
            raise
        except ProbeError as exc:  # torch (or a --backend-module) cannot be loaded here
            inst = self.instance
            self.harness_failure = InstanceResult(
                "error", f"{inst.where()}: not run: {exc}",
                expected_kind=inst.expectation.kind,
                harness_error={"type": "ProbeError", "message": str(exc), "traceback": "",
                               "stage": "reading what torch offers"})
        except Exception as exc:  # a bug of the harness: the instance still gets its record
            self.harness_failure = internal_error(self.instance, exc, "setting up")

    def _setup(self) -> None:
        hs = harness_session(self.config)
        start_ahead(self.session, hs)
        self.prepared = hs.runner.prepare(self.instance)
        self.instance = self.prepared.instance
        self._tell_news(hs)  # a breaker a run ahead of its turn tripped (harness.plugin.ahead)
        if self.prepared.skip:
            self.record = skipped_record(self.instance, self.prepared.skip, self.nodeid)
            # Point -rs at the YAML case rather than at this line.
            raise pytest.skip.Exception(self.prepared.skip, _use_item_location=True)

    def runtest(self) -> None:
        inst = self.instance
        t0 = time.monotonic()
        result = self.harness_failure
        if result is None:
            assert self.prepared is not None
            hs = harness_session(self.config)
            first = hs.ahead.take(self.nodeid, inst, self._tell_waiting) if hs.ahead else None
            result = hs.runner.execute(self.prepared, on_wait=self._tell_waiting,
                                       first=first).result
            self._tell_news(hs)
        # The item's own time: a run made ahead of its turn includes the wait for it.
        result.duration = time.monotonic() - t0
        self.result = result
        self.record = instance_record(inst, result, self.nodeid)
        if result.outcome == "xfail":
            pytest.xfail(result.message)
        if result.outcome in BAD_OUTCOMES:
            raise CaseFailure(result)
        if result.outcome == "uncheckable":  # not a pass: JUnit shows it skipped, with why
            pytest.skip(result.message)

    def _tell_news(self, hs: HarnessSession) -> None:
        """Each line of a breaker that tripped (harness.runner.breaker, .starts), once."""
        for line in hs.runner.news():
            self._say(f"collective-harness: {line}", red=True)

    def _tell_waiting(self, note: str) -> None:
        """A long wait is not silence: a line in pytest's terminal (the record is
        unchanged)."""
        self._say(f"collective-harness: {self.nodeid}: {note}", yellow=True)

    def _say(self, line: str, **markup: bool) -> None:
        """A line in pytest's terminal while the test runs (not on xdist workers, whose
        output nobody sees)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or hasattr(self.config, "workerinput"):
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        # Output capture covers the test's call: step out of it, as pytest's live logging does.
        with (capture.global_and_fixture_disabled() if capture is not None
              else contextlib.nullcontext()):
            reporter.ensure_newline()
            # Under -q the progress letters leave the line open without telling
            # ensure_newline; a note must start a line of its own (tools read them by prefix).
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")
            reporter.write_line(line, **markup)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, CaseFailure):
            r = excinfo.value.result
            label = {"failed": "FAILED", "error": "ERROR", "hang": "HANG",
                     "crash": "CRASH"}[r.outcome]
            return f"[{label}] {r.message}"
        if isinstance(excinfo.value, pytest.xfail.Exception):
            # A known divergence: its record holds the message. pytest's own rendering of the
            # exception parses this file's source for every xfail, 0.2 s each (15 s of the
            # quick suite's 71), for a traceback that -rx never shows.
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.instance.line - 1, f"{self.instance.case}[{self.instance.id}]"


def start_ahead(session: pytest.Session, hs: HarnessSession) -> None:
    """Once per session, at the first case's setup: start the isolated instances of the run
    on background threads (harness.plugin.ahead). Not on xdist workers (a worker runs only
    the items it is sent), with --perf (timings need a quiet machine) or with --ahead 0."""
    if hs.ahead_started:
        return
    hs.ahead_started = True
    if hs.is_worker or hs.ahead_workers == 0 or hs.settings.perf.enabled:
        return
    todo: list[tuple[str, Prepared]] = []
    for item in session.items:
        if not isinstance(item, CaseItem) or not item.instance.isolate:
            continue
        try:
            prepared = hs.runner.prepare(item.instance)
        except Exception:  # the item's own setup or run reports it
            continue
        if not (prepared.skip or prepared.problem):
            todo.append((item.nodeid, prepared))
    if todo:
        ahead = hs.start_ahead()
        for nodeid, prepared in todo:
            ahead.submit(nodeid, prepared)


def lost_record(item: CaseItem, rep: pytest.TestReport) -> dict[str, Any]:
    """The record of an instance that reached pytest's report without one (a failure outside
    the harness's own checks, e.g. another plugin's fixture): an ``error``, never silence."""
    inst = item.instance
    detail = str(rep.longrepr)[-4000:] if rep.longrepr else "no result was produced"
    result = InstanceResult(
        "error", f"{inst.file}:{inst.line}: {inst.case}[{inst.id}]: no result was produced "
        f"({rep.when} {rep.outcome}); the harness could not judge this instance:\n{detail}",
        expected_kind=inst.expectation.kind,
        harness_error={"type": "NoResult", "message": f"{rep.when} {rep.outcome}",
                       "traceback": detail, "stage": rep.when})
    return instance_record(inst, result, item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Any:
    rep = yield
    if not isinstance(item, CaseItem) or getattr(item, "_record_sent", False):
        return rep
    if not (call.when == "call" or rep.skipped or rep.failed or call.when == "teardown"):
        return rep
    if item.record is None or (call.when == "setup" and rep.failed):
        # Every collected instance gets exactly one record, whatever went wrong.
        item.record = lost_record(item, rep)
    setattr(rep, RECORD_ATTR, json.dumps(item.record))
    item._record_sent = True  # type: ignore[attr-defined]
    outcome = item.record["outcome"]
    setattr(rep, OUTCOME_ATTR, outcome)
    item.user_properties.append(("outcome", outcome))
    if outcome != "passed":  # JUnit consumers show properties beside the test

        item.user_properties.append(("detail", one_line(item.record)))
        if item.record["reason"]:
            item.user_properties.append(("reason", item.record["reason"]))
    if outcome == "xpass":
        rep.wasxfail = item.record["reason"]  # pytest shows it as XPASS
    return rep


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config
                             ) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
    # A limitation is not a pass: its own category in the summary line ("504 limitation"),
    # "L" in progress, LIMITATION with -v; -rL lists them (see pytest_terminal_summary).
    if (report.when == "call" and report.passed
            and getattr(report, OUTCOME_ATTR, None) == "limitation"):
        return "limitation", "L", ("LIMITATION", {"blue": True})
    if report.when == "call" and getattr(report, OUTCOME_ATTR, None) == "uncheckable":
        return "uncheckable", "U", ("UNCHECKABLE", {"yellow": True})
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Runs on the xdist controller for worker reports too: the record travels on the report.
    text = getattr(report, RECORD_ATTR, None)
    if text is None:
        return
    config = CONFIG.get("config")
    if config is not None:
        harness_session(config).add_record(json.loads(text))
