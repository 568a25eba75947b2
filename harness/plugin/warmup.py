"""Warm-up: the forkserver and the capability probe started while pytest is still busy.

Before, the first instance's setup started the forkserver (torch imported: about 1.3 s), then
forked the probe that reads what torch offers, and only then the first pool: seconds in which
the pytest process waited, after it had spent as long importing plugins and collecting. Now a
session that names case files (a ``.yaml`` argument, or a path inside a directory named like
``collective_case_dirs``) starts the forkserver at ``pytest_configure``, and any other session
at its first collected case file; the probe runs on a background thread as soon as the
forkserver may serve processes (after collection, see :mod:`harness.run.forkserver`), so the
first instance finds it done. Not on the xdist controller (it runs no ranks), nor for
``--collect-only``, ``--help`` or ``--version``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import threading
from pathlib import Path

import pytest

from ..run import forkserver
from ..run.capabilities import probe
from ..run.torchfacts import ProbeError
from .state import HarnessSession

CASE_SUFFIXES = (".yaml", ".yml")


def names_case_files(config: pytest.Config) -> bool:
    """Whether the command line names case files: a YAML file, or a path with a directory
    named like ``collective_case_dirs`` in it (``pytest cases/``). Decided from the words
    alone: nothing is read from disk."""
    dirs = [str(d) for d in config.getini("collective_case_dirs")]
    here = config.invocation_params.dir
    for arg in config.args:
        path = Path(arg.split("::", 1)[0])
        if path.suffix.lower() in CASE_SUFFIXES:
            return True
        parts = (here / path).parts
        if any(fnmatch.fnmatchcase(part, pattern) for part in parts for pattern in dirs):
            return True
    return False


def runs_no_ranks(config: pytest.Config, hs: HarnessSession) -> bool:
    """Sessions that never start a rank here: collection only, help, the xdist controller."""
    opt = config.option
    if opt.collectonly or getattr(opt, "help", False) or getattr(opt, "version", False):
        return True
    controller = not hs.is_worker and (bool(getattr(opt, "numprocesses", None))
                                       or getattr(opt, "dist", "no") != "no")
    return controller


def start(config: pytest.Config, hs: HarnessSession, *, named: bool) -> None:
    """Start the forkserver and the probe behind it, once per session: at configure time
    when ``named`` (the command line names case files), else at the first case file."""
    if hs.warmed or (named and not names_case_files(config)) or runs_no_ranks(config, hs):
        return
    hs.warmed = True
    forkserver.start_early()
    thread = threading.Thread(target=_probe_when_ready, args=(hs.backend_modules,),
                              name="collective-probe", daemon=True)
    thread.start()


def _probe_when_ready(backend_modules: tuple[str, ...]) -> None:
    # Never the one to end the forkserver's wait for its list: that is collection's word.
    forkserver.wait_for_list()
    with contextlib.suppress(ProbeError):  # cached: the first instance reports it
        probe(backend_modules)
