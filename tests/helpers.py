"""Helpers shared by the tests: reports, case files in temporary projects, child pytest
sessions and launchers (started in a session of their own and killed with it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import jsonschema

from harness.report.records import report_schema

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# How long a test waits for a child process or an event before calling it hung. A backstop,
# not a bound on speed: the harness's own deadlines end a real hang long before, and a busy CI
# runner (load 15-38 on 2 cores) runs tens of times slower than an idle one. Nothing a test
# checks depends on it; a test that waits this long is broken and fails.
HANG_S = 1800.0


def load_report(path: Path) -> dict[str, Any]:
    """Read a JSON report and check it against the shipped schema."""
    report = json.loads(path.read_text())
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    return dict(report)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child pytest that can import tests/fault_backend.py."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def marked(marker: str) -> list[int]:
    """Pids of every live (not zombie) process whose environment carries ``marker``."""
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/stat") as fh:
                if fh.read().split(") ", 1)[1][0] == "Z":
                    continue
        except OSError:
            continue
        pids.append(int(entry))
    return pids


def rank_pids(marker: str, rank: int | None = None) -> list[int]:
    """Pids of live processes whose environment carries ``marker`` and that are ranks (of
    rank number ``rank`` only, when given: the process is named after it)."""
    want = f"coll-rank{rank}" if rank is not None else "coll-rank"
    pids: list[int] = []
    for pid in marked(marker):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if comm == want if rank is not None else comm.startswith(want):
            pids.append(pid)
    return pids


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


PYTHON = sys.executable


def free_port() -> int:
    """A TCP port nothing listens on right now (for a launcher's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_case_file(where: Path, text: str, name: str = "c.yaml", conftest: str = "") -> Path:
    """``text`` (dedented) written as ``where/name``, with ``conftest`` beside it if given;
    returns ``where`` (the project directory)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / name).write_text(textwrap.dedent(text))
    if conftest:
        (where / "conftest.py").write_text(textwrap.dedent(conftest))
    return where


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    """Each record's outcome by key."""
    return {r["key"]: r["outcome"] for r in report["records"]}


def pytest_argv(*args: str) -> list[str]:
    """A child pytest's command line (no cache: runs must not depend on each other)."""
    return [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", *args]


def run_pytest(where: Path, *args: str, timeout: float = HANG_S,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a child pytest in ``where`` to its end; output captured, ``extra_env`` added."""
    return subprocess.run(pytest_argv(*args), cwd=where, capture_output=True, text=True,
                          errors="replace", timeout=timeout,
                          env=subprocess_env(**(extra_env or {})))


def start(where: Path, argv: list[str], merge_stderr: bool = False,
          env: dict[str, str] | None = None, **extra: str) -> subprocess.Popen[str]:
    """Start ``argv`` in ``where`` in a session of its own, so that :func:`finish` can kill
    it with everything it started (ranks, launcher workers). ``env``: the whole environment
    (default :func:`subprocess_env`), ``extra`` added to it."""
    full = {**(env if env is not None else subprocess_env()), **extra}
    return subprocess.Popen(argv, cwd=where, env=full, text=True,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Wait for ``proc`` (at most ``timeout`` s), then kill its whole session whatever
    happened: nothing a test starts outlives it."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")


def case_instances(text: str, backend: str = "gloo") -> list[Any]:
    """Load, validate and expand the case file ``text`` (dedented) as ``cases/x.yaml``."""
    import textwrap

    from harness.casefile import expand, validate
    from harness.casefile import load as yamlload

    doc = yamlload.load_text(textwrap.dedent(text), "cases/x.yaml")
    return [i for c in validate.load_cases(doc) for i in expand.expand(c, backend)]


def case_error(text: str, backend: str = "gloo") -> str:
    """The rendered collection error of the case file ``text``; fails the test if none."""
    from harness.errors import CaseFileError, CaseFileErrors

    try:
        case_instances(text, backend)
    except (CaseFileError, CaseFileErrors) as exc:
        return str(exc)
    raise AssertionError("the case file was accepted; an error was expected")


def has_module(name: str, conn: Any) -> None:
    """Run in a process forked from the forkserver: send whether ``name`` is imported there
    (what the forkserver preloaded, since the child imports nothing before it runs this)."""
    conn.send(name in sys.modules)
    conn.close()


def signal_state(pid: int) -> str:
    """A process's signal masks as the kernel reports them (blocked, ignored, caught), for the
    message of a test whose signal a child seems not to have received."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return " ".join(ln.strip() for ln in fh
                            if ln.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError as exc:
        return f"status unreadable: {exc}"
