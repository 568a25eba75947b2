"""The pytest plugin: YAML case files become parametrized tests run on real process groups.

Registered through the ``pytest11`` entry point. Import-light on purpose: torch is imported
only when the first case runs, never at import or collection time.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import shlex
import signal
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from . import ops
from .casefile import expand, load, overrides, validate
from .casefile.limits import OPTIONS as LIMIT_OPTIONS
from .casefile.limits import Limits
from .errors import CaseFileError, CaseFileErrors, Pos, clip
from .gate import baseline, compare, versions
from .model import Instance, InstanceResult
from .ordering import plan as ordering
from .perf import plan as perfplan
from .perf import stats as perfstats
from .report import html, markdown
from .report.headline import verdict as report_verdict
from .report.oneline import one_line
from .report.records import (
    build_report,
    instance_record,
    json_text,
    skipped_record,
    write_all,
)
from .run.capabilities import probe
from .run.pool import ForeignAnswerError, PoolKey, PoolManager, PoolStartError, check_deadline
from .verdict.outcome import judge

CASE_SUFFIXES = (".yaml", ".yml")
BAD_OUTCOMES = ("failed", "error", "hang", "crash")
RECORD_ATTR = "collective_record"
OUTCOME_ATTR = "collective_outcome"
MAX_MISSING_LISTED = 200


class CaseFailure(Exception):
    """Raised by an item whose instance did not meet its expectation."""

    def __init__(self, result: InstanceResult) -> None:
        self.result = result
        super().__init__(result.message)


# -- options --------------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("collective-harness", "collective-harness conformance cases")
    names = ["--collective-backend"]
    try:
        group.addoption("--backend", "--collective-backend", dest="collective_backend",
                        default=None, metavar="NAME",
                        help="backend to test: gloo (default), nccl, or one registered by "
                             "--backend-module")
    except ValueError:  # another plugin owns --backend: keep the long form only
        group.addoption(*names, dest="collective_backend", default=None, metavar="NAME",
                        help="backend to test (gloo, nccl, ...)")
    group.addoption("--backend-module", dest="collective_backend_modules", action="append",
                    default=[], metavar="MODULE",
                    help="import MODULE in the parent and in every rank before the process "
                         "group starts (lets a third-party backend register itself)")
    group.addoption("--deadline", dest="collective_deadline", type=float, default=None,
                    metavar="SECONDS", help="per-instance deadline before a hang is declared")
    group.addoption("--world-size", dest="collective_world_sizes", default=None,
                    metavar="N[,N...]", help="only run instances with these world sizes")
    group.addoption("--full", dest="collective_full", action="store_true", default=False,
                    help="also run cases marked 'full' (the long matrix)")
    group.addoption("--report-json", dest="collective_report_json", default=None,
                    metavar="PATH", help="JSON report path (default reports/conformance.json)")
    group.addoption("--report-md", dest="collective_report_md", default=None, metavar="PATH",
                    help="Markdown report path (default reports/conformance.md)")
    group.addoption("--report-html", dest="collective_report_html", default=None,
                    metavar="PATH", help="HTML report path (default reports/conformance.html)")
    group.addoption("--baseline", dest="collective_baseline", default=None, metavar="PATH",
                    help="gate the run against this baseline (ci/baselines/...): the session "
                         "fails on regressions and new failures, not on known ones")
    group.addoption("--baseline-match", dest="collective_baseline_match", default="auto",
                    choices=("auto", "exact", "agnostic"),
                    help="how instances are matched with the baseline (see collective-gate)")
    group.addoption("--no-report", dest="collective_no_report", action="store_true",
                    default=False, help="write no report files")
    group.addoption("--launched-world-size", dest="collective_launched_world_size", type=int,
                    default=None, metavar="N",
                    help="what 'world_size: launched' means with the harness's own pools "
                         f"(default {expand.DEFAULT_LAUNCHED}); under a launcher it is the "
                         "launched world size")
    group.addoption("--max-pools", dest="collective_max_pools", type=int, default=None,
                    metavar="N", help="rank pools kept alive at once (default 2)")
    ordering.add_options(group, parser)
    perfplan.add_options(group, parser)
    for _field, flag, ini, text in LIMIT_OPTIONS:
        group.addoption(flag, dest=ini, default=None, metavar="N",
                        help=f"limit: {text} (ini {ini})")
        parser.addini(ini, f"limit: {text}", default="")
    parser.addini("collective_case_dirs", "directory names (globs) whose YAML files are case "
                  "files, at any depth (YAML files named on the command line always are)",
                  type="linelist", default=["cases"])
    parser.addini("collective_backend", "default backend", default="gloo")
    parser.addini("collective_backend_modules", "modules to import before init",
                  type="linelist", default=[])
    parser.addini("collective_deadline", "per-instance deadline in seconds", default="60")
    parser.addini("collective_report_json", "JSON report path",
                  default="reports/conformance.json")
    parser.addini("collective_report_md", "Markdown report path",
                  default="reports/conformance.md")
    parser.addini("collective_report_html", "HTML report path",
                  default="reports/conformance.html")
    parser.addini("collective_baseline", "baseline to gate the run against (optional)",
                  default="")
    parser.addini("collective_max_pools", "rank pools kept alive at once", default="2")
    parser.addini("collective_launched_world_size", "what 'world_size: launched' means here",
                  default=str(expand.DEFAULT_LAUNCHED))


class HarnessSession:
    """Per-process state: options, the pool manager, and the records collected."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        opt = config.getoption
        self.backend: str = opt("collective_backend") or str(config.getini("collective_backend"))
        mods = opt("collective_backend_modules") or config.getini("collective_backend_modules")
        self.backend_modules: tuple[str, ...] = tuple(mods)
        self.deadline: float = _seconds("--deadline", opt("collective_deadline")
                                        or config.getini("collective_deadline"))
        self.limits = _limits(config, self.deadline)
        self.collected_count = 0  # instances collected so far (the per-session limit)
        ws = opt("collective_world_sizes")
        self.world_sizes = {int(x) for x in ws.split(",")} if ws else None
        self.full: bool = opt("collective_full")
        self.max_pools = int(opt("collective_max_pools") or config.getini("collective_max_pools"))
        self.launched = int(opt("collective_launched_world_size")
                            or config.getini("collective_launched_world_size"))
        self.records: list[dict[str, Any]] = []
        self._manager: Any = None
        self.is_worker = hasattr(config, "workerinput")
        # Node ids of the case instances selected to run (after -k/-m/--world-size/--full):
        # every one must end with a record, or the report says the session is incomplete.
        self.collected: set[str] = set()
        self.deselected = 0
        self.ended_by = ""  # set when pytest is interrupted or fails internally

    @property
    def manager(self) -> Any:
        if self._manager is None:
            self._manager = PoolManager(max_pools=self.max_pools,
                                        pg_timeout_s=max(600.0, self.deadline * 4))
        return self._manager

    def options(self) -> dict[str, Any]:
        return {"backend": self.backend, "backend_modules": list(self.backend_modules),
                "deadline_s": self.deadline, "full": self.full,
                "world_sizes": sorted(self.world_sizes) if self.world_sizes else None,
                "launched_world_size": self.launched,
                **ordering.options(self.config), **perfplan.options(self.config)}

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


_SESSION = pytest.StashKey[HarnessSession]()


def _seconds(name: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{name}: {str(value)[:60]!r} is not a number of seconds"
                                ) from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise pytest.UsageError(f"{name}: must be a positive, finite number of seconds, got "
                                f"{str(value)[:60]!r}")
    return seconds


def _limits(config: pytest.Config, deadline: float) -> Limits:
    """The operator's limits from the command line, else the ini file, else the defaults.

    The deadline cap defaults to the session deadline: a case's own ``deadline:`` may lower it
    and may raise it only when the operator sets ``--max-deadline`` above ``--deadline``.
    """
    values: dict[str, Any] = {"deadline": deadline}
    for field, flag, ini, _text in LIMIT_OPTIONS:
        raw = config.getoption(ini) or str(config.getini(ini))
        if not raw:
            continue
        if field == "deadline":
            values[field] = _seconds(flag, raw)
            continue
        try:
            number = float(raw) if field == "sleep" else int(raw)
        except ValueError:
            raise pytest.UsageError(f"{flag} / {ini}: {raw[:60]!r} is not a number") from None
        values[field] = number
    try:
        return Limits(**values)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _hs(config: pytest.Config) -> HarnessSession:
    return config.stash[_SESSION]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SESSION] = HarnessSession(config)
    _load_baseline(config)
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
        # parent's death on their own, within a fraction of a second).
        signal.signal(signal.SIGTERM, _sigterm)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def pytest_unconfigure(config: pytest.Config) -> None:
    hs = config.stash.get(_SESSION, None)
    if hs is not None:
        hs.close()


# -- collection -----------------------------------------------------------------------------

def is_case_file(file_path: Path, config: pytest.Config) -> bool:
    """Whether a YAML file is a case file: named on the command line, or inside a directory
    whose name matches ``collective_case_dirs`` (default ``cases``). Decided from the path
    alone, never from the content, so a malformed case file is reported, never skipped."""
    if file_path.suffix.lower() not in CASE_SUFFIXES:
        return False
    here = config.invocation_params.dir
    for arg in config.args:
        named = Path(arg.split("::", 1)[0])
        if (here / named).resolve() == file_path.resolve():
            return True
    dirs = [str(d) for d in config.getini("collective_case_dirs")]
    return any(fnmatch.fnmatchcase(part, pattern) for part in file_path.parent.parts
               for pattern in dirs)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if not is_case_file(file_path, parent.config):
        return None
    return CaseFile.from_parent(parent, path=file_path)


class CaseFile(pytest.File):
    """A YAML case file: validated at collection, one item per instance."""

    def collect(self) -> list[pytest.Item]:

        hs = _hs(self.config)
        try:
            display = str(self.path.relative_to(self.config.rootpath))
        except ValueError:
            display = str(self.path)
        try:
            doc = load.load_file(str(self.path), display, hs.limits)
            cases = validate.load_cases(doc)
            instances: list[Instance] = []
            problems: list[CaseFileError] = []
            for case in cases:  # expansion problems of every case, reported together
                try:
                    instances += expand.expand(case, hs.backend, hs.limits, len(instances),
                                               launched=hs.launched)
                except CaseFileError as exc:
                    problems.append(exc)
                except CaseFileErrors as exc:
                    problems += exc.errors
            if problems:
                raise CaseFileErrors(problems) if len(problems) > 1 else problems[0]
            if len(instances) > hs.limits.instances_per_file:
                raise CaseFileError(Pos(display, 1, 1), f"the file expands to "
                                    f"{len(instances)} instances; the limit is "
                                    f"{hs.limits.instances_per_file}",
                                    hint="raise --max-instances-per-file / ini "
                                    "collective_max_instances_per_file")
            if hs.collected_count + len(instances) > hs.limits.instances_per_session:
                raise CaseFileError(Pos(display, 1, 1), f"collecting its {len(instances)} "
                                    f"instances would exceed this session's limit of "
                                    f"{hs.limits.instances_per_session}",
                                    hint="raise --max-instances / ini collective_max_instances")
        except (CaseFileError, CaseFileErrors) as exc:
            raise self.CollectError(str(exc)) from None
        except RecursionError:
            raise self.CollectError(f"{display}:1:1: the file is nested too deeply to read"
                                    ) from None
        except Exception as exc:  # a harness bug must still name the file, not dump a trace
            raise self.CollectError(
                f"{display}:1:1: internal error of collective-harness while reading this "
                f"file: {type(exc).__name__}: {clip(str(exc), 200)} (please report it)"
            ) from None
        hs.collected_count += len(instances)
        items: list[pytest.Item] = []
        for inst in instances:
            # The id is given in pytest's own form (name, then the bracketed parameters), so
            # the ids the cache records for --lf/--ff/--sw parse back to these items' ids.
            name = f"{inst.case}[{inst.id}]"
            item = CaseItem.from_parent(self, name=name, nodeid=f"{self.nodeid}::{name}",
                                        instance=inst)
            items.append(item)
        return items


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
        except Exception as exc:  # a bug of the harness: the instance still gets its record
            self.harness_failure = internal_error(self.instance, exc, "setting up")

    def _setup(self) -> None:
        hs = _hs(self.config)
        caps = probe(hs.backend_modules)
        self.not_applied = overrides.not_applied(self.instance, caps.torch_version,
                                                  caps.nccl_version)
        resolved = overrides.resolve(self.instance, caps.torch_version, caps.nccl_version)
        self.instance = perfplan.configure(ordering.configure(resolved, self.config),
                                           self.config)
        reason = self.instance.expectation.skip or caps.skip_reason(self.instance)
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

    def _drop_pool(self) -> None:
        """After an internal error the pool's state is unknown: never reuse it."""
        hs = _hs(self.config)
        inst = self.instance
        if not inst.isolate:
            # The record already says what went wrong; a failing discard adds nothing.
            with contextlib.suppress(Exception):
                hs.manager.discard(PoolKey(inst.backend, inst.device, inst.world_size,
                                           hs.backend_modules))

    def _run(self) -> InstanceResult:
        hs = _hs(self.config)
        inst = self.instance
        deadline = inst.deadline or hs.deadline
        # A case's environment and process-group timeout are part of what a pool is.
        key = PoolKey(inst.backend, inst.device, inst.world_size, hs.backend_modules,
                      env=inst.env, pg_timeout_s=inst.pg_timeout, bind_device=inst.bind_device)
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
        for _attempt in range(2):
            try:
                pool = hs.manager.isolated(key) if inst.isolate else hs.manager.get(key)
                run = pool.run(inst, deadline)
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
            result = judge(inst, run, deadline)
            if result.outcome == "passed" and perfplan.enabled(self.config):
                # Only a passed instance gets numbers: a bandwidth never hides a failure.
                result.perf = (perfstats.aggregate(inst, run.results) if inst.perf
                               else {"not_timed": perfplan.not_timed(inst)})
            result.pool_replaced = bool(hs.manager.settle(pool, inst, run))
            if foreign:
                result.pool_replaced = True
                result.message += ("\n  (run on a fresh pool: the first pool's answer did not "
                                   f"belong to this instance and was discarded: {foreign})")
            return result
        raise AssertionError("unreachable")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, CaseFailure):
            r = excinfo.value.result
            label = {"failed": "FAILED", "error": "ERROR", "hang": "HANG",
                     "crash": "CRASH"}[r.outcome]
            return f"[{label}] {r.message}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.instance.line - 1, f"{self.instance.case}[{self.instance.id}]"


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


def _lost_record(item: CaseItem, rep: pytest.TestReport) -> dict[str, Any]:
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


# -- scheduling and reporting ----------------------------------------------------------------

def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    hs = _hs(config)
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if isinstance(item, CaseItem):
            inst = item.instance
            if hs.world_sizes is not None and inst.world_size not in hs.world_sizes:
                dropped.append(item)
                continue
            if "full" in inst.marks and not hs.full:
                dropped.append(item)
                continue
            if "perf" in inst.marks and not perfplan.enabled(config):
                dropped.append(item)
                continue
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    # Group instances by pool so each pool starts once; other tests keep their order.
    others = [i for i in keep if not isinstance(i, CaseItem)]
    case_items = sorted((i for i in keep if isinstance(i, CaseItem)), key=CaseItem.pool_key)
    cases: list[pytest.Item] = list(case_items)
    items[:] = others + cases


def pytest_deselected(items: list[pytest.Item]) -> None:
    # -k, -m, --world-size, --full: a selection, recorded as such, not incompleteness.
    config = _CONFIG.get("config")
    if config is not None:
        _hs(config).deselected += sum(isinstance(i, CaseItem) for i in items)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _hs(session.config).collected.update(i.nodeid for i in session.items
                                         if isinstance(i, CaseItem))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    # The xdist controller collects nothing itself: each worker tells it what it collected.
    config = _CONFIG.get("config")
    if config is not None:
        _hs(config).collected.update(i for i in ids
                                     if i.split("::", 1)[0].endswith((".yaml", ".yml")))


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    config = _CONFIG.get("config")
    if config is not None:
        value = excinfo.value
        # pytest stops for collection errors by raising Session.Interrupted, a
        # KeyboardInterrupt: say which it was, not "Ctrl-C".
        _hs(config).ended_by = ("terminated (SIGTERM)" if str(value) == "SIGTERM" else
                                f"stopped by pytest: {value}"
                                if isinstance(value, pytest.Session.Interrupted)
                                else "interrupted (Ctrl-C / KeyboardInterrupt)")


def pytest_internalerror(excrepr: Any, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    config = _CONFIG.get("config")
    if config is not None:
        _hs(config).ended_by = f"internal error in pytest: {excinfo.typename}: {excinfo.value}"[
            :300]


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
        item.record = _lost_record(item, rep)
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
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Runs on the xdist controller for worker reports too: the record travels on the report.
    text = getattr(report, RECORD_ATTR, None)
    if text is None:
        return
    config = _CONFIG.get("config")
    if config is not None:
        _hs(config).records.append(json.loads(text))


_CONFIG: dict[str, pytest.Config] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    hs = _hs(session.config)
    hs.close()
    if hs.is_worker:
        return
    base = session.config.stash.get(_BASELINE, None)
    config = session.config
    if config.option.collectonly:
        return
    info = session_info(session, hs, int(exitstatus))
    config.stash[_INFO] = info
    if (hs.records or hs.collected) and not config.getoption("collective_no_report"):
        write_reports(config, hs, info)
    if base is not None:
        _gate_session(session, hs, base, info)
    elif session.exitstatus == pytest.ExitCode.OK and report_verdict(
            dict(Counter(r["outcome"] for r in hs.records)), info) != "PASS":
        # pytest exits 0 on a non-strict xpass; the report says FAIL, and a script or CI job
        # that reads only the exit status must not see a pass the report does not give.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_INFO = pytest.StashKey[dict[str, Any]]()


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
    bad_records = sum(r["outcome"] in BAD_OUTCOMES for r in hs.records)
    opt = session.config.option
    return {
        "complete": not missing,
        "collected": len(hs.collected | have),
        "without_result": len(missing),
        "missing": missing[:MAX_MISSING_LISTED],
        "ended_by": ended or "finished",
        "pytest_exit_status": exitstatus,
        "pytest_failures": int(session.testsfailed),
        "unexplained_failures": max(0, int(session.testsfailed) - bad_records),
        "selection": {"keyword": getattr(opt, "keyword", "") or None,
                      "markexpr": getattr(opt, "markexpr", "") or None,
                      "world_sizes": sorted(hs.world_sizes) if hs.world_sizes else None,
                      "full": hs.full, "deselected": hs.deselected},
    }


def _report(hs: HarnessSession, info: dict[str, Any] | None = None) -> dict[str, Any]:

    meta: dict[str, Any] = (probe(hs.backend_modules).metadata() if hs.records
                            else {"torch": "", "hostname": ""})
    meta["options"] = hs.options()
    return build_report(hs.records, meta, info)


def write_reports(config: pytest.Config, hs: HarnessSession,
                  info: dict[str, Any] | None = None) -> None:
    """Write the JSON, Markdown and HTML reports (controller only), as one set: all three
    are rendered first and replaced together, so they never disagree."""

    report = _report(hs, info)
    root = config.rootpath
    paths = [root / (config.getoption(f"collective_report_{kind}")
                     or str(config.getini(f"collective_report_{kind}")))
             for kind in ("json", "md", "html")]
    write_all([(str(paths[0]), json_text(report)), (str(paths[1]), markdown.render(report)),
               (str(paths[2]), html.render(report))])
    shown = [os.path.relpath(p) for p in paths]
    # Printed in the terminal summary, on lines of their own (after -q's progress dots too).
    config.stash[_WRITTEN] = (f"collective-harness: {report['summary']['headline']}\n"
                              f"collective-harness: report written to "
                              f"{', '.join(shown[:-1])} and {shown[-1]}")


# -- gating against a baseline (--baseline) ------------------------------------------------------

_BASELINE = pytest.StashKey[Any]()
_GATE = pytest.StashKey[Any]()
_WRITTEN = pytest.StashKey[str]()


def _load_baseline(config: pytest.Config) -> None:
    """Read --baseline at start-up, so a wrong path fails before any rank starts."""
    path = config.getoption("collective_baseline") or str(config.getini("collective_baseline"))
    if not path or hasattr(config, "workerinput"):
        return
    try:
        base = baseline.load(str(config.rootpath / path), _refresh_hint(config, path))
        base.path = path  # shown as the user wrote it
        config.stash[_BASELINE] = base
    except baseline.BaselineError as exc:
        raise pytest.UsageError(f"--baseline: {exc}") from None


def _refresh_hint(config: pytest.Config, path: str) -> str:
    """The commands that (re)create the baseline ``path`` from the paths this run was given."""
    report = (config.getoption("collective_report_json")
              or str(config.getini("collective_report_json")))
    run = shlex.join(["pytest", *(list(config.args) or ["."]), "--backend", _hs(config).backend,
                      "--report-json", report])
    return baseline.refresh_hint(path, report, run)


def _gate_session(session: pytest.Session, hs: HarnessSession, base: Any,
                  info: dict[str, Any]) -> None:
    """Classify this session's instances against the baseline and set the exit status from
    the verdict: regressions fail the session even when every test "passed" (a skip, a
    missing instance under a strict policy), and failures the baseline records as known do
    not, as long as nothing else failed."""
    config = session.config
    report = _report(hs, info)
    res = compare.compare(baseline.entries_from_report(report), base,
                          config.getoption("collective_baseline_match"),
                          across_versions=versions.across(report, base))
    compare.check_session(res, report)
    res.report_label = f"of this session ({', '.join(res.report_backends) or 'no instances'})"
    res.baseline_label = f"{base.path} ({', '.join(base.backends)}, torch {base.torch or '?'})"
    res.refresh_hint = _refresh_hint(config, base.path)
    config.stash[_GATE] = res
    known = sum(r["outcome"] in BAD_OUTCOMES for r in hs.records)
    if not res.ok and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif (res.ok and session.exitstatus == pytest.ExitCode.TESTS_FAILED
          and session.testsfailed == known and info["complete"]):
        # Every pytest failure is a record the baseline knows: the gate's verdict stands.
        session.exitstatus = pytest.ExitCode.OK


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, None)
    if written is not None:
        terminalreporter.ensure_newline()
        for line in written.splitlines():
            terminalreporter.write_line(line)
    chars = str(getattr(config.option, "reportchars", "") or "")
    limits = terminalreporter.stats.get("limitation", [])
    if limits and ("L" in chars or "A" in chars):
        terminalreporter.section("limitations (raised, crashed or hung as declared)", sep="-")
        for rep in limits:
            text = getattr(rep, RECORD_ATTR, None)
            why = json.loads(text).get("reason", "") if text else ""
            terminalreporter.write_line(f"LIMITATION {rep.nodeid} - {why}")
    info = config.stash.get(_INFO, None)
    if info is not None and not info["complete"]:
        terminalreporter.write_line(
            f"collective-harness: INCOMPLETE: {info['without_result']} of {info['collected']} "
            f"collected instance(s) have no result; the session ended: {info['ended_by']}",
            red=True, bold=True)
    res = config.stash.get(_GATE, None)
    if res is None:
        return
    terminalreporter.section("collective-harness gate", sep="=", bold=True,
                             red=not res.ok, green=res.ok)
    for line in compare.render_text(res, max_list=50).rstrip().splitlines():
        terminalreporter.write_line(line)
