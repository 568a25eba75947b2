"""The pytest plugin: YAML case files become parametrized tests run on real process groups.

Registered through the ``pytest11`` entry point. Import-light on purpose: torch is imported
only when the first case runs, never at import or collection time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from . import ops
from .casefile import expand, load, overrides, validate
from .errors import CaseFileError, CaseFileErrors
from .gate import baseline, compare, versions
from .model import Instance, InstanceResult
from .ordering import plan as ordering
from .report import html, markdown
from .report.oneline import one_line
from .report.records import (
    build_report,
    instance_record,
    skipped_record,
    write_atomic,
    write_json,
)
from .run.capabilities import probe
from .run.pool import PoolKey, PoolManager, PoolStartError
from .verdict import judge

CASES_RE = re.compile(r"^cases\s*:", re.MULTILINE)
BAD_OUTCOMES = ("failed", "error", "hang", "crash")
RECORD_ATTR = "collective_record"


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
    group.addoption("--max-pools", dest="collective_max_pools", type=int, default=None,
                    metavar="N", help="rank pools kept alive at once (default 2)")
    ordering.add_options(group, parser)
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


class HarnessSession:
    """Per-process state: options, the pool manager, and the records collected."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        opt = config.getoption
        self.backend: str = opt("collective_backend") or str(config.getini("collective_backend"))
        mods = opt("collective_backend_modules") or config.getini("collective_backend_modules")
        self.backend_modules: tuple[str, ...] = tuple(mods)
        self.deadline: float = float(opt("collective_deadline")
                                     or config.getini("collective_deadline"))
        ws = opt("collective_world_sizes")
        self.world_sizes = {int(x) for x in ws.split(",")} if ws else None
        self.full: bool = opt("collective_full")
        self.max_pools = int(opt("collective_max_pools") or config.getini("collective_max_pools"))
        self.records: list[dict[str, Any]] = []
        self._manager: Any = None
        self.is_worker = hasattr(config, "workerinput")

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
                **ordering.options(self.config)}

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None


_SESSION = pytest.StashKey[HarnessSession]()


def _hs(config: pytest.Config) -> HarnessSession:
    return config.stash[_SESSION]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SESSION] = HarnessSession(config)
    _load_baseline(config)
    config.addinivalue_line("markers", "collective: a collective-harness case instance")
    config.addinivalue_line("markers", "full: part of the long matrix (run with --full)")
    for name in sorted({*ops.ALL_OPS, *(op.family for op in ops.ALL_OPS.values())}):
        config.addinivalue_line("markers", f"{name}: instances of the {name} op/family")
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

def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix not in (".yaml", ".yml"):
        return None
    try:
        head = file_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if not CASES_RE.search(head):
        return None  # not a case file (workflow files, configs...)
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
            doc = load.load_file(str(self.path), display)
            cases = validate.load_cases(doc)
            instances = [inst for case in cases for inst in expand.expand(case, hs.backend)]
        except (CaseFileError, CaseFileErrors) as exc:
            raise self.CollectError(str(exc)) from None
        items: list[pytest.Item] = []
        for inst in instances:
            item = CaseItem.from_parent(self, name=f"{inst.case}[{inst.id}]", instance=inst)
            items.append(item)
        return items


class CaseItem(pytest.Item):
    """One instance of a case."""

    def __init__(self, *, instance: Instance, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.instance = instance
        self.record: dict[str, Any] | None = None
        self.result: InstanceResult | None = None
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

        hs = _hs(self.config)
        caps = probe(hs.backend_modules)
        self.instance = ordering.configure(overrides.resolve(self.instance, caps.torch_version),
                                           self.config)
        reason = self.instance.expectation.skip or caps.skip_reason(self.instance)
        if reason:
            self.record = skipped_record(self.instance, reason, self.nodeid)
            # Point -rs at the YAML case rather than at this line.
            raise pytest.skip.Exception(reason, _use_item_location=True)

    def runtest(self) -> None:

        hs = _hs(self.config)
        inst = self.instance
        deadline = inst.deadline or hs.deadline
        key = PoolKey(inst.backend, inst.device, inst.world_size, hs.backend_modules)
        t0 = time.monotonic()
        pool = None
        try:
            pool = hs.manager.isolated(key) if inst.isolate else hs.manager.get(key)
            run = pool.run(inst, deadline)
        except PoolStartError as exc:
            result = InstanceResult("error", f"{inst.file}:{inst.line}: {inst.case}[{inst.id}]:"
                                    f" {exc}", expected_kind=inst.expectation.kind)
        else:
            result = judge(inst, run, deadline)
            replace = run.kind != "done" or any(r.status == "raised"
                                                for r in run.results.values())
            if inst.isolate:
                pool.close()
            elif replace:
                hs.manager.discard(key)
            elif result.outcome != "passed" and not pool.ping():
                hs.manager.discard(key)
                replace = True
            result.pool_replaced = replace
        result.duration = time.monotonic() - t0
        self.result = result
        self.record = instance_record(inst, result, self.nodeid)
        if result.outcome == "xfail":
            pytest.xfail(result.message)
        if result.outcome in BAD_OUTCOMES:
            raise CaseFailure(result)

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
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    # Group instances by pool so each pool starts once; other tests keep their order.
    others = [i for i in keep if not isinstance(i, CaseItem)]
    case_items = sorted((i for i in keep if isinstance(i, CaseItem)), key=CaseItem.pool_key)
    cases: list[pytest.Item] = list(case_items)
    items[:] = others + cases


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Any:
    rep = yield
    if isinstance(item, CaseItem) and item.record is not None and not getattr(
            item, "_record_sent", False) and (call.when == "call" or rep.skipped):
        setattr(rep, RECORD_ATTR, json.dumps(item.record))
        item._record_sent = True  # type: ignore[attr-defined]
        outcome = item.record["outcome"]
        item.user_properties.append(("outcome", outcome))
        if outcome != "passed":  # JUnit consumers show properties beside the test

            item.user_properties.append(("detail", one_line(item.record)))
            if item.record["reason"]:
                item.user_properties.append(("reason", item.record["reason"]))
        if outcome == "xpass":
            rep.wasxfail = item.record["reason"]  # pytest shows it as XPASS
    return rep


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
    if hs.records and not session.config.getoption("collective_no_report"):
        write_reports(session.config, hs)
    if base is not None:
        _gate_session(session, hs, base)


def _report(hs: HarnessSession) -> dict[str, Any]:

    meta: dict[str, Any] = (probe(hs.backend_modules).metadata() if hs.records
                            else {"torch": "", "hostname": ""})
    meta["options"] = hs.options()
    return build_report(hs.records, meta)


def write_reports(config: pytest.Config, hs: HarnessSession) -> None:
    """Write the JSON, Markdown and HTML reports (controller only)."""

    report = _report(hs)
    root = config.rootpath
    paths = [root / (config.getoption(f"collective_report_{kind}")
                     or str(config.getini(f"collective_report_{kind}")))
             for kind in ("json", "md", "html")]
    write_json(str(paths[0]), report)
    write_atomic(str(paths[1]), markdown.render(report))
    write_atomic(str(paths[2]), html.render(report))
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.ensure_newline()
        shown = [os.path.relpath(p) for p in paths]
        tr.write_line(f"collective-harness: report written to {', '.join(shown[:-1])} and "
                      f"{shown[-1]}")


# -- gating against a baseline (--baseline) ------------------------------------------------------

_BASELINE = pytest.StashKey[Any]()
_GATE = pytest.StashKey[Any]()


def _load_baseline(config: pytest.Config) -> None:
    """Read --baseline at start-up, so a wrong path fails before any rank starts."""
    path = config.getoption("collective_baseline") or str(config.getini("collective_baseline"))
    if not path or hasattr(config, "workerinput"):
        return
    try:
        base = baseline.load(str(config.rootpath / path))
        base.path = path  # shown as the user wrote it
        config.stash[_BASELINE] = base
    except baseline.BaselineError as exc:
        raise pytest.UsageError(f"--baseline: {exc}") from None


def _gate_session(session: pytest.Session, hs: HarnessSession, base: Any) -> None:
    """Classify this session's instances against the baseline and set the exit status from
    the verdict: regressions fail the session even when every test "passed" (a skip, a
    missing instance under a strict policy), and failures the baseline records as known do
    not, as long as nothing else failed."""
    config = session.config
    report = _report(hs)
    res = compare.compare(baseline.entries_from_report(report), base,
                          config.getoption("collective_baseline_match"),
                          across_versions=versions.across(report, base))
    res.report_label = f"of this session ({', '.join(res.report_backends) or 'no instances'})"
    res.baseline_label = f"{base.path} ({', '.join(base.backends)}, torch {base.torch or '?'})"
    config.stash[_GATE] = res
    known = sum(r["outcome"] in BAD_OUTCOMES for r in hs.records)
    if not res.ok and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif (res.ok and session.exitstatus == pytest.ExitCode.TESTS_FAILED
          and session.testsfailed == known):
        session.exitstatus = pytest.ExitCode.OK


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    res = config.stash.get(_GATE, None)
    if res is None:
        return
    terminalreporter.section("collective-harness gate", sep="=", bold=True,
                             red=not res.ok, green=res.ok)
    for line in compare.render_text(res, max_list=50).rstrip().splitlines():
        terminalreporter.write_line(line)
