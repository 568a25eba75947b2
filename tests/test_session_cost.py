"""What a pytest session costs around its instances (issue 44): the forkserver started while
pytest collects, the modules the cases' torch modes need still preloaded there, and no
Hypothesis import at a harness session's end.

Timings are not asserted (the benchmarks in ci/bench/ measure them): each test checks the
behaviour a saving rests on, and fails on the code before it.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from .helpers import PYTHON, REPO, run_pytest, subprocess_env

CASE = """
cases:
  - name: sum
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
"""

# A conftest that says, at collection's end (before any instance runs), whether this pytest
# process has a forkserver child, and at the session's end whether Hypothesis was imported.
PROBE_CONFTEST = '''
import os, sys
import pytest

def _forkserver_children():
    mine = str(os.getpid())
    found = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = fh.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        found += ppid == mine and b"multiprocessing.forkserver" in cmd
    return found

@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    print(f"FORKSERVER_AT_COLLECTION {_forkserver_children()}")

def pytest_unconfigure(config):
    ours = [m for m in sys.modules if m.split(".")[0] == "harness"]
    rewritten = sorted(m for m in ours if type(getattr(sys.modules[m].__spec__, "loader", None))
                       .__name__ == "AssertionRewritingHook")
    print(f"HARNESS_MODULES {len(ours)} REWRITTEN {rewritten}")
    print(f"HYPOTHESIS_IMPORTED {'hypothesis' in sys.modules}")
    print(f"HYPOTHESIS_PLUGIN {config.pluginmanager.has_plugin('hypothesispytest')}")
'''


def project(tmp_path: Path, extra: dict[str, str] | None = None) -> Path:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "c.yaml").write_text(textwrap.dedent(CASE))
    (tmp_path / "conftest.py").write_text(PROBE_CONFTEST)
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


@pytest.fixture(scope="module")
def plain_session(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One ordinary harness session with the probe conftest, run once: each test below reads
    a different line of what it printed."""
    out = run_pytest(project(tmp_path_factory.mktemp("plain")), "cases", "-s", "-q",
                     "--no-report")
    assert out.returncode == 0, out.stdout[-2000:]
    return out


def test_the_forkserver_starts_before_collection_ends(
        plain_session: subprocess.CompletedProcess[str]) -> None:
    out = plain_session
    assert "FORKSERVER_AT_COLLECTION 1" in out.stdout, out.stdout[-2000:]


def test_collect_only_starts_no_forkserver(tmp_path: Path) -> None:
    out = run_pytest(project(tmp_path), "cases", "-s", "-q", "--collect-only")
    assert "FORKSERVER_AT_COLLECTION 0" in out.stdout, out.stdout[-2000:]


def test_a_harness_session_does_not_import_hypothesis(
        plain_session: subprocess.CompletedProcess[str]) -> None:
    # Hypothesis's plugin imports hypothesis in its terminal summary (0.7 s) to print
    # nothing: unregistered when no test imported it.
    out = plain_session
    assert "HYPOTHESIS_IMPORTED False" in out.stdout, out.stdout[-2000:]
    assert "HYPOTHESIS_PLUGIN False" in out.stdout


def test_pytest_does_not_rewrite_the_harness_modules(
        plain_session: subprocess.CompletedProcess[str]) -> None:
    # pytest marks the whole distribution of a pytest11 plugin for assertion rewriting, and
    # then compiles each module from source where it cannot cache (PYTHONDONTWRITEBYTECODE,
    # as here): harness/__init__.py takes the mark back, so only the package root itself,
    # imported before it could, goes through pytest's hook.
    line = next(ln for ln in plain_session.stdout.splitlines() if ln.startswith("HARNESS_MODULES"))
    count, rewritten = line.split()[1], line.split(" REWRITTEN ", 1)[1]
    assert int(count) > 50 and rewritten == "['harness']", line


def test_hypothesis_stays_for_a_session_that_uses_it(tmp_path: Path) -> None:
    test = """
        from hypothesis import given, strategies as st

        @given(st.integers())
        def test_int(x):
            assert isinstance(x, int)
    """
    out = run_pytest(project(tmp_path, {"test_h.py": test}), "cases", "test_h.py", "-s", "-q",
                     "--no-report", "--hypothesis-show-statistics")
    assert out.returncode == 0, out.stdout[-2000:]
    assert "HYPOTHESIS_PLUGIN True" in out.stdout
    assert "Hypothesis Statistics" in out.stdout  # its terminal summary still ran


def _script(body: str) -> str:
    code = textwrap.dedent("""
        import multiprocessing
        from harness.run import forkserver
        from tests.helpers import has_module

        def child_has(name):
            recv, send = multiprocessing.Pipe(duplex=False)
            proc = forkserver.start_child(has_module, (name, send))
            send.close()
            got = recv.recv()
            proc.join()
            return got

        if __name__ == "__main__":
    """) + textwrap.indent(textwrap.dedent(body), "    ")
    out = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=subprocess_env())
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_modules_named_after_an_early_start_are_preloaded() -> None:
    # colorsys: a module nothing in the harness or torch imports.
    out = _script("""
        assert forkserver.start_early()
        assert forkserver.preload(["colorsys"])  # collection's list, after the start
        print("CHILD_HAS", child_has("colorsys"))
        assert not forkserver.preload(["wave"])  # too late once a process was forked
    """)
    assert "CHILD_HAS True" in out


def test_the_first_process_ends_the_wait_for_the_list() -> None:
    # Something asks the forkserver for a process before collection said what to preload
    # (a --backend check at start-up): it is served, with the list as it stands.
    out = _script("""
        assert forkserver.start_early()
        print("CHILD_HAS", child_has("colorsys"))
        assert not forkserver.preload(["colorsys"])
    """)
    assert "CHILD_HAS False" in out


FSEXIT = '''
import atexit, os, sys
# Registered before fsexit, like torch's handlers in the forkserver: the forkserver skips them.
atexit.register(lambda: open(f"teardown-{os.getpid()}", "w").close())
import harness.run.fsexit
child = os.fork()
if child == 0:
    sys.exit(3)  # a process forked from it: its own status and its own teardown
_, status = os.waitpid(child, 0)
print(os.waitstatus_to_exitcode(status), child, end="")  # left in the buffer: flushed on leaving
'''


def test_the_forkserver_skips_its_teardown_and_its_children_keep_theirs(tmp_path: Path) -> None:
    """The forkserver ends without the interpreter's teardown (which, with torch imported,
    holds the session's output open for about 0.3 s after pytest ends), its buffered output
    written; a process forked from it exits with its own status, through its own teardown."""
    res = subprocess.run([PYTHON, "-c", FSEXIT], cwd=tmp_path, env=subprocess_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    status, child = res.stdout.split()
    assert status == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"teardown-{child}"]
