"""Command-line and ini options of the plugin, and the checks that turn them into numbers.

Every option is declared here (docs/reference/generated/options.md lists them); a value that
cannot be used is a ``pytest.UsageError`` naming the option, before any case is collected.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from ..casefile import expand
from ..casefile.limits import OPTIONS as LIMIT_OPTIONS
from ..casefile.limits import Limits
from ..ordering import plan as ordering
from ..perf import plan as perfplan
from ..runner.settings import FRESH_RERUNS


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
    group.addoption("--manifest", dest="collective_manifest", default=None, metavar="FILE",
                    help="the backend's capability manifest: what it claims, what it wraps "
                         "(inherits:), what it declares unsupported (docs: Certify your "
                         "backend); sets --backend and adds its module")
    group.addoption("--after-hang", dest="collective_after_hang", default="run",
                    choices=("run", "skip"),
                    help="skip: after a hang no case declared, skip every later instance that "
                         "needs what hung (an op, or subgroups), each with a reason naming it "
                         "(default run: run everything collected)")
    group.addoption("--deadline", dest="collective_deadline", type=float, default=None,
                    metavar="SECONDS", help="per-instance deadline before a hang is declared")
    group.addoption("--world-size", dest="collective_world_sizes", default=None,
                    metavar="N[,N...]", help="only run instances with these world sizes")
    group.addoption("--full", dest="collective_full", action="store_true", default=False,
                    help="also run cases marked 'full' (the long matrix)")
    group.addoption("--check-iters", dest="collective_check_iters", default="1",
                    metavar="N", help="run each instance whose expected values the reference "
                    "model computes N times on fresh inputs, checking every iteration "
                    "(docs/howto/numerics.md)")
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
    group.addoption("--fresh-reruns", dest="collective_fresh_reruns", type=int, default=None,
                    metavar="N",
                    help="run a failed instance once more on fresh ranks when an earlier "
                         "instance failed or raised on the same ranks, to tell state the "
                         "backend carried between instances; at most N times a session "
                         f"(default {FRESH_RERUNS}; 0: never); the outcome stays a failure")
    group.addoption("--ahead", dest="collective_ahead", type=int, default=None, metavar="N",
                    help="isolated instances (declared hangs and crashes, programs that make "
                         "groups, isolate: true) run ahead of their turn, each on its own "
                         "pool, N at a time while the main pool works (default 2; 0: in "
                         "turn; off on xdist workers and with --perf)")
    for flags, dest, default, text, choices in ordering.OPTIONS:
        kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": text}
        if choices:
            kwargs["choices"] = choices
        else:
            kwargs.update(type=float, metavar="SECONDS")
        try:
            group.addoption(*flags, **kwargs)
        except ValueError:  # another plugin owns the short form: keep the long one only
            group.addoption(flags[-1], **kwargs)
        parser.addini(dest, text, default=default)
    group.addoption("--perf", dest="collective_perf", action="store_true", default=False,
                    help="after each passing instance's check, time its op like nccl-tests "
                         "and report time, algbw and busbw (also runs cases marked 'perf')")
    parser.addini("collective_perf", "performance mode on (true/false)", type="bool",
                  default=False)
    for opt, ini, typ, default, text in perfplan.SETTINGS:
        group.addoption(opt, dest=ini, type=typ, default=None, metavar="N", help=text)
        parser.addini(ini, text, default=str(default))
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
    parser.addini("collective_fresh_reruns", "failures run again on fresh ranks at most, "
                  "per session (0: never)", default=str(FRESH_RERUNS))
    parser.addini("collective_ahead", "isolated instances run ahead of their turn at once "
                  "(0: in turn)", default="2")
    parser.addini("collective_launched_world_size", "what 'world_size: launched' means here",
                  default=str(expand.DEFAULT_LAUNCHED))


def ordering_settings(config: pytest.Config) -> ordering.OrderingSettings:
    """``--ordering`` and ``--ordering-delay`` (options win over ini values)."""
    raw = {dest: config.getoption(dest) for _f, dest, _d, _t, _c in ordering.OPTIONS}
    mode = raw["collective_ordering"] or str(config.getini("collective_ordering"))
    delay = raw["collective_ordering_delay"]
    try:
        if delay is None:
            delay = float(str(config.getini("collective_ordering_delay")))
        return ordering.OrderingSettings(mode=mode, delay_s=float(delay))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def perf_settings(config: pytest.Config) -> perfplan.PerfSettings:
    """``--perf`` and its loop settings (options win over ini values; read only when the
    mode is on, so that a setting nobody uses cannot fail a session)."""
    if not (config.getoption("collective_perf") or config.getini("collective_perf")):
        return perfplan.PerfSettings()
    values = {opt: config.getoption(ini) if config.getoption(ini) is not None
              else config.getini(ini) for opt, ini, _typ, _d, _t in perfplan.SETTINGS}
    try:
        loop = perfplan.loop_settings(values)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    return perfplan.PerfSettings(enabled=True, loop=loop)


def parse_seconds(name: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{name}: {str(value)[:60]!r} is not a number of seconds"
                                ) from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise pytest.UsageError(f"{name}: must be a positive, finite number of seconds, got "
                                f"{str(value)[:60]!r}")
    return seconds


def operator_limits(config: pytest.Config, deadline: float) -> Limits:
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
            values[field] = parse_seconds(flag, raw)
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


def whole_number(name: str, value: Any, least: int, most: int) -> int:
    """An integer option (or ini value) within ``least..most``, else a usage error naming it."""
    try:
        number = int(str(value), 10)
    except ValueError:
        raise pytest.UsageError(f"{name}: {str(value)[:60]!r} is not a whole number") from None
    if not least <= number <= most:
        raise pytest.UsageError(f"{name}: {number} is outside {least}..{most}")
    return number
