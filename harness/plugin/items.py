"""Items: one case instance set up (overrides, capabilities), run on a rank pool and judged.

Every collected instance ends with exactly one record, attached to pytest's report so that it
travels from xdist workers to the controller: a harness bug or another plugin's failure is an
``error`` record, never a missing one.
"""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from ..casefile import numerics, overrides
from ..model import Instance, InstanceResult
from ..ordering import plan as ordering
from ..perf import plan as perfplan
from ..perf import stats as perfstats
from ..report import costs
from ..report.oneline import one_line
from ..report.records import instance_record, skipped_record
from ..run.capabilities import probe
from ..run.pool import ForeignAnswerError, PoolKey, PoolStartError, check_deadline
from ..run.torchfacts import ProbeError
from ..verdict.outcome import judge
from .state import (
    BAD_OUTCOMES,
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
        self.not_applied: list[dict[str, Any]] = []
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
        inst = self.instance
        return (inst.backend, inst.device, inst.world_size, inst.isolate)

    def setup(self) -> None:

        try:
            self._setup()
        except pytest.skip.Exception:
            raise
        except ProbeError as exc:  # torch (or a --backend-module) cannot be loaded here
            inst = self.instance
            self.harness_failure = InstanceResult(
                "error", f"{inst.file}:{inst.line}: {inst.case}[{inst.id}]: not run: {exc}",
                expected_kind=inst.expectation.kind,
                harness_error={"type": "ProbeError", "message": str(exc), "traceback": "",
                               "stage": "reading what torch offers"})
        except Exception as exc:  # a bug of the harness: the instance still gets its record
            self.harness_failure = internal_error(self.instance, exc, "setting up")

    def _setup(self) -> None:
        hs = harness_session(self.config)
        start_ahead(self.session, hs)
        self.instance, self.not_applied, reason = resolve(self.config, hs, self.instance)
        if reason:
            self.record = skipped_record(self.instance, reason, self.nodeid)
            # Point -rs at the YAML case rather than at this line.
            raise pytest.skip.Exception(reason, _use_item_location=True)

    def runtest(self) -> None:
        inst = self.instance
        t0 = time.monotonic()
        result = self.harness_failure
        if result is None:
            try:
                result = self._run()
            except Exception as exc:  # a bug of the harness, not a verdict on the backend
                result = internal_error(inst, exc, "running or judging")
                self._drop_pool()
        result.duration = time.monotonic() - t0
        result.overrides_not_applied = self.not_applied
        self.result = result
        self.record = instance_record(inst, result, self.nodeid)
        if result.outcome == "xfail":
            pytest.xfail(result.message)
        if result.outcome in BAD_OUTCOMES:
            raise CaseFailure(result)
        if result.outcome == "uncheckable":  # not a pass: JUnit shows it skipped, with why
            pytest.skip(result.message)

    def _drop_pool(self) -> None:
        """After an internal error the pool's state is unknown: never reuse it."""
        hs = harness_session(self.config)
        inst = self.instance
        if not inst.isolate:
            # The record already says what went wrong; a failing discard adds nothing.
            with contextlib.suppress(Exception):
                hs.manager.discard(PoolKey(inst.backend, inst.device, inst.world_size,
                                           hs.backend_modules))

    def _run(self) -> InstanceResult:
        hs = harness_session(self.config)
        inst = self.instance
        deadline = inst.deadline or hs.deadline
        key = pool_key(hs, inst)
        where = f"{inst.file}:{inst.line}: {inst.case}[{inst.id}]"
        try:
            check_deadline(deadline)
        except ValueError as exc:  # never reaches a pool: it could not be enforced
            return InstanceResult("error", f"{where}: {exc}; set `deadline:` in the case or "
                                  "--deadline to a number of seconds",
                                  expected_kind=inst.expectation.kind)
        return self._run_bound(hs, key, where, deadline)

    def _run_bound(self, hs: HarnessSession, key: PoolKey, where: str,
                   deadline: float) -> InstanceResult:
        """Run the instance; judge only answers bound to it.

        An answer that belongs to another request (see :class:`ForeignAnswerError`) has
        discarded its pool: the instance is re-run once on a fresh pool, and reported as a
        harness error if that happens again.
        """
        inst = self.instance
        foreign = ""
        ran = hs.ahead.take(self.nodeid, inst, self._tell_waiting) if hs.ahead else None
        for _attempt in range(2):
            t0 = time.monotonic()
            try:
                if ran is not None:  # run ahead on its own pool (harness.plugin.ahead)
                    if ran.start_error:
                        raise PoolStartError(ran.start_error)
                    assert ran.pool is not None and ran.run is not None
                    pool, run = ran.pool, ran.run
                    t0, t_pool = t0 - ran.pool_s - ran.run_s, t0 - ran.run_s
                    ran, ahead_run = None, True
                else:
                    ahead_run = False
                    pool = hs.manager.isolated(key) if inst.isolate else hs.manager.get(key)
                    t_pool = time.monotonic()
                    run = pool.run(inst, deadline, on_wait=self._tell_waiting)
            except PoolStartError as exc:
                return InstanceResult("error", f"{where}: {exc}",
                                      expected_kind=inst.expectation.kind)
            except ForeignAnswerError as exc:
                if foreign:
                    return InstanceResult(
                        "error", f"{where}: harness error: two pools in a row answered with "
                        f"messages that do not belong to this instance, so nothing was judged."
                        f"\n  first: {foreign}\n  then: {exc}",
                        expected_kind=inst.expectation.kind, pool_replaced=True)
                foreign = str(exc)
                continue
            t_run = time.monotonic()
            result = judge(inst, run, deadline)
            result.ran_ahead = ahead_run
            if result.outcome == "passed" and perfplan.enabled(self.config):
                # Only a passed instance gets numbers: a bandwidth never hides a failure.
                result.perf = (perfstats.aggregate(inst, run.results) if inst.perf
                               else {"not_timed": perfplan.not_timed(inst)})
            t_judge = time.monotonic()
            result.pool_replaced = bool(hs.manager.settle(pool, inst, run))
            result.phases = costs.phases(run, pool_s=t_pool - t0, run_s=t_run - t_pool,
                                         judge_s=t_judge - t_run,
                                         settle_s=time.monotonic() - t_judge)
            if foreign:
                result.pool_replaced = True
                result.message += ("\n  (run on a fresh pool: the first pool's answer did not "
                                   f"belong to this instance and was discarded: {foreign})")
            return result
        raise AssertionError("unreachable")

    def _tell_waiting(self, note: str) -> None:
        """A long wait is not silence: a line in pytest's terminal (not on xdist workers,
        whose output nobody sees; the record is unchanged)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or hasattr(self.config, "workerinput"):
            return
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        # Output capture covers the test's call: step out of it, as pytest's live logging does.
        with (capture.global_and_fixture_disabled() if capture is not None
              else contextlib.nullcontext()):
            reporter.ensure_newline()
            reporter.write_line(f"collective-harness: {self.nodeid}: {note}", yellow=True)

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


def resolve(config: pytest.Config, hs: HarnessSession, instance: Instance
            ) -> tuple[Instance, list[dict[str, Any]], str]:
    """The instance as it will run here (overrides for this torch/NCCL applied, ordering and
    perf plans configured, --check-iters applied), the overrides that did not apply, and why
    it is skipped ("")."""
    caps = probe(hs.backend_modules)
    not_applied = overrides.not_applied(instance, caps.torch_version, caps.nccl_version)
    resolved = overrides.resolve(instance, caps.torch_version, caps.nccl_version)
    inst = numerics.check_iters(
        perfplan.configure(ordering.configure(resolved, config), config), hs.check_iters)
    return inst, not_applied, inst.expectation.skip or caps.skip_reason(inst)


def pool_key(hs: HarnessSession, inst: Instance) -> PoolKey:
    """The pool an instance runs on: a case's environment and process-group timeout are part
    of what a pool is."""
    return PoolKey(inst.backend, inst.device, inst.world_size, hs.backend_modules,
                   env=inst.env, pg_timeout_s=inst.pg_timeout, bind_device=inst.bind_device)


def start_ahead(session: pytest.Session, hs: HarnessSession) -> None:
    """Once per session, at the first case's setup: start the isolated instances of the run
    on background threads (harness.plugin.ahead). Not on xdist workers (a worker runs only
    the items it is sent), with --perf (timings need a quiet machine) or with --ahead 0."""
    if hs.ahead_started:
        return
    hs.ahead_started = True
    if hs.is_worker or hs.ahead_workers == 0 or perfplan.enabled(hs.config):
        return
    todo: list[tuple[str, Instance]] = []
    for item in session.items:
        if not isinstance(item, CaseItem) or not item.instance.isolate:
            continue
        try:
            inst, _, reason = resolve(hs.config, hs, item.instance)
            check_deadline(inst.deadline or hs.deadline)
        except Exception:  # the item's own setup or run reports it
            continue
        if not reason:
            todo.append((item.nodeid, inst))
    if todo:
        ahead = hs.start_ahead()
        for nodeid, inst in todo:
            ahead.submit(nodeid, inst, pool_key(hs, inst), inst.deadline or hs.deadline)


def internal_error(inst: Instance, exc: BaseException, stage: str) -> InstanceResult:
    """The ``error`` result of an instance on which the harness itself failed: it says so, and
    keeps the traceback, rather than dropping the instance from the report."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = f"{type(exc).__name__}: {exc}"[:2000]
    message = (f"{inst.file}:{inst.line}: {inst.case}[{inst.id}]: internal error in "
               f"collective-harness while {stage} this instance; this is a bug in the harness, "
               f"not a verdict on the backend (please report it):\n  {text}\n{tb.rstrip()}")
    return InstanceResult("error", message, expected_kind=inst.expectation.kind,
                          harness_error={"type": type(exc).__name__, "message": str(exc),
                                         "traceback": tb, "stage": stage})


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
