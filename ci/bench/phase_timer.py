"""A pytest plugin that says when each phase of a session began (issue 44's profile).

    PYTHONPATH=ci/bench pytest -p phase_timer cases/ --backend gloo -q
    PHASE_TIMER_JSON=phases.json PYTHONPATH=ci/bench pytest -p phase_timer ...

Each mark is the wall time since the process started (read from /proc, so interpreter start
and imports before pytest count) and the process's CPU time: pytest and its plugins loaded
(``configure``), collection, the first instance's setup and call (the forkserver, the
capability probe and the first pool before it), the last instance done, and the session's
end (reports, the pools stopped). Printed on stderr at exit, or written as JSON. Loaded with
``-p`` it is imported before the entry-point plugins, so the first mark is pytest's own start.
Its figures are quoted in docs/explanation/process-model.md ("Session cost"); bench_budgets.py
uses it for the whole-session budget.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import pytest


def _process_start() -> float:
    """The epoch time at which this process started."""
    with open("/proc/self/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


START = _process_start()
MARKS: list[tuple[str, float, float]] = []
SEEN: set[str] = set()


def mark(name: str) -> None:
    MARKS.append((name, time.time() - START, time.process_time()))


def once(name: str) -> None:
    if name not in SEEN:
        SEEN.add(name)
        mark(name)


mark("pytest imported, plugins loading")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    mark("configure (plugins loaded)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    mark("collection starts")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    mark(f"collection done ({len(session.items)} items)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    once("first setup")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    once("first call (forkserver, probe, first pool ready)")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    mark("last instance done")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    mark("session end (reports written, pools stopped)")
    rows: list[dict[str, Any]] = [{"phase": n, "wall_s": round(w, 4), "cpu_s": round(c, 4)}
                                  for n, w, c in MARKS]
    out = os.environ.get("PHASE_TIMER_JSON")
    if out:
        with open(out, "w") as fh:
            json.dump(rows, fh, indent=1)
        return
    for r in rows:
        sys.stderr.write(f"{r['wall_s']:8.3f} s  cpu {r['cpu_s']:7.3f} s  {r['phase']}\n")
