"""Shared setup for the harness's own tests."""

from __future__ import annotations

# pytester's in-process runs restore sys.modules afterwards; a module first imported inside a
# run is dropped and imported again by the next one, which crashes for torch's C extension.
# Load everything a run imports lazily before any run starts.
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.heap
import multiprocessing.popen_forkserver
import multiprocessing.resource_sharer
import multiprocessing.resource_tracker
import multiprocessing.sharedctypes  # noqa: F401
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed  # noqa: F401

import harness.casefile.expand
import harness.report.markdown
import harness.report.records
import harness.run.capabilities
import harness.run.pool
import harness.verdict.outcome  # noqa: F401
from tests.runs import Run, make_project, run_pytest

# Case files used as test inputs are data, not part of this test run.
collect_ignore_glob = ["data/*"]


# -- the process's signal state, as each test found it ------------------------------------------

SIGNALS = (signal.SIGINT, signal.SIGTERM)

# A background job of a non-interactive shell (`bash -c 'ci/test.sh &'`, nohup) starts with
# SIGINT and SIGQUIT ignored, and every child inherits that through exec: the children of the
# tests that send Ctrl-C would then sit through it (seen as the child's SigIgn 0x...1006). The
# tests start their children with Ctrl-C working, as a user's terminal does.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _ignored_here() -> set[signal.Signals]:
    """The signals of :data:`SIGNALS` this process ignores, as the kernel says."""
    with open("/proc/self/status") as fh:
        line = next(ln for ln in fh if ln.startswith("SigIgn:"))
    mask = int(line.split()[1], 16)
    return {s for s in SIGNALS if mask >> (s - 1) & 1}


@pytest.fixture(autouse=True)
def _signal_state_kept() -> Iterator[None]:
    """A test leaves this process's SIGINT and SIGTERM handling (dispositions, and the signals
    its thread blocks) as it found it. Children inherit an ignored or blocked signal through
    exec: a later test's child pytest would then sit through the Ctrl-C or SIGTERM that test
    sends it, and fail for what an earlier test on the same worker did. A test that changes
    the state fails, naming what it changed, and the state is put back."""
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ignored = _ignored_here()
    yield
    changed = [f"{s.name} handler {handlers[s]!r} -> {signal.getsignal(s)!r}"
               for s in SIGNALS if signal.getsignal(s) != handlers[s]]
    # What Python's getsignal cannot see: a disposition set from C (a loaded extension).
    now_ignored = _ignored_here()
    changed += [f"{s.name} ignored by the process (set from C)" for s in now_ignored - ignored]
    now = signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    changed += [f"blocked signals {sorted(blocked)} -> {sorted(now)}"] if now != blocked else []
    for s in SIGNALS:
        if (signal.getsignal(s) != handlers[s] or s in now_ignored - ignored) and (
                handlers[s] is not None):
            signal.signal(s, handlers[s])
    if changed:
        pytest.fail("the test left this process's signal state changed: " + "; ".join(changed))


# -- real conformance runs shared by the gate, HTML and JUnit tests ------------------------------


@pytest.fixture(scope="session")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The small gate case file on Gloo: passes, one xfail, one skip (JUnit xunit2 default)."""
    project = make_project(tmp_path_factory.mktemp("gloo"))
    run = run_pytest(project, "gloo", "--junitxml=reports/junit.xml")
    assert run.returncode == 0, run.output
    return run


@pytest.fixture(scope="session")
def gloo_baseline(gloo_run: Run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A baseline written by ``collective-gate --update`` from :func:`gloo_run`."""
    from harness.gate import cli as gate

    path = tmp_path_factory.mktemp("baseline") / "gloo.json"
    assert gate.main([str(gloo_run.json), str(path), "--update"]) == 0
    return path


@pytest.fixture(scope="session")
def faulty_run(gloo_baseline: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same cases on the fault-injecting backend, gated by ``--baseline`` against the Gloo
    baseline, with JUnit in the xunit1 family (file and line attributes)."""
    project = make_project(tmp_path_factory.mktemp("faulty"))
    return run_pytest(project, "faulty", "--baseline", str(gloo_baseline),
                      "--report-html", "reports/matrix.html",
                      "--junitxml=reports/junit.xml", "-o", "junit_family=xunit1")
