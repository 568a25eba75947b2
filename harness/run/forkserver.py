"""The forkserver every rank is forked from: torch imported once, and started early.

Ranks are forked from one ``multiprocessing`` forkserver per session, which imports torch
(about 1.3 s) and the harness's rank code before it forks anything. Started on first use,
that import sat between collection and the first instance. :func:`start_early` starts it at
the beginning of a session instead, while pytest still imports plugins and collects; what
the collected cases' torch modes need (:func:`preload`, known only once collection is over)
reaches it afterwards through :mod:`harness.run.latepreload`: the forkserver imports torch,
then waits for that list on a socket before it serves its first fork. Whatever asks the
forkserver for a process first (:func:`forkserver_context`) ends the wait, with the list as
it then stands, so nothing can wait on a list that never comes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.spawn
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import latepreload
from .children import ForkserverContext

# fsexit last: its exit handler must run before those of the modules imported before it
BASE_PRELOAD = ("torch", "torch.distributed", "harness.program.interpreter",
                "harness.ordering.probes", "harness.run.fsexit")

_lock = threading.RLock()
_ctx: Any = None
_extra: list[str] = []  # see preload()
_pending: _LateList | None = None  # an early forkserver waiting for the extra modules


class _LateList:
    """The parent's end of the late preload: a socket the forkserver connects to once torch
    is imported, and a thread that answers it with the module list once that is final."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="collective-harness-fs-")
        self.path = os.path.join(self.dir, "preload.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(self.path)
            self.listener.listen(1)
        except OSError:
            self.close()
            raise
        self.final = threading.Event()
        self.modules: list[str] = []
        self.thread = threading.Thread(target=self._answer, name="collective-preload",
                                       daemon=True)

    def _answer(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # closed: the session ended before the forkserver asked
            return
        with conn:
            self.final.wait()
            with contextlib.suppress(OSError):  # the forkserver died: its users will see
                conn.sendall(json.dumps(self.modules).encode())
        self.close()

    def release(self, modules: list[str]) -> None:
        self.modules = list(modules)
        self.final.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def without_main_module() -> Iterator[None]:
    """Start children without re-importing ``__main__`` in them.

    Spawn-style start methods re-run the parent's main script in each child; under pytest that
    is pytest's own entry script (slow, and pointless: ranks need only harness.run.rank), and for a
    user's script without a ``__main__`` guard it would recurse.
    """
    original = multiprocessing.spawn.get_preparation_data

    def without_main(name: str) -> dict[str, Any]:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _lock:
        multiprocessing.spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = original


def preload(modules: Iterator[str] | tuple[str, ...] | list[str]) -> bool:
    """Have the forkserver import ``modules`` too, so that ranks forked from it do not each pay
    for them, and end an early forkserver's wait for this list. Only a forkserver that has
    not served a process yet takes them: returns False (and changes nothing) once one has,
    which costs time, never correctness."""
    global _pending
    with _lock:
        if _ctx is not None and _pending is None:
            return False
        for name in modules:
            if name not in _extra:
                _extra.append(name)
        if _pending is not None:
            _pending.release(_extra)
            _pending = None
        return True


def _context(late: _LateList | None) -> Any:
    ctx = ForkserverContext()  # exit statuses safe to read from any thread (children.py)
    ctx.set_forkserver_preload([*BASE_PRELOAD, *_extra,
                                *([latepreload.__name__] if late is not None else [])])
    return ctx


def start_early() -> bool:
    """Start the forkserver now, in the background (its torch import overlaps whatever the
    session does next); the extra modules follow by :func:`preload`. False if one was
    already started (or cannot be: then the first use starts it as before)."""
    global _ctx, _pending
    with _lock:
        if _ctx is not None:
            return False
        try:
            late = _LateList()
        except OSError:  # no socket here (a TMPDIR path too long for one): start on first use
            return False
        ctx = _context(late)
        # The forkserver inherits the environment as it is when it is spawned: the path of the
        # socket travels there (and latepreload removes it from the forkserver's environment).
        os.environ[latepreload.ENV] = late.path
        try:
            multiprocessing.forkserver.ensure_running()
        except Exception:
            late.close()
            return False
        finally:
            os.environ.pop(latepreload.ENV, None)
        atexit.register(late.close)  # a session that never used it: no socket left behind
        late.thread.start()
        _ctx, _pending = ctx, late
        return True


def wait_for_list(timeout: float | None = None) -> bool:
    """Wait until an early forkserver has its final module list (at once if there is no early
    forkserver waiting); False if ``timeout`` passed first. For work that must not be the
    one to end the wait (a probe run ahead of the first instance)."""
    with _lock:
        late = _pending
    return late is None or late.final.wait(timeout)


def forkserver_context() -> Any:
    """The forkserver context every pool starts its ranks from (torch preloaded once). A
    process about to be started from it ends an early forkserver's wait for its list."""
    global _ctx, _pending
    with _lock:
        if _ctx is None:
            _ctx = _context(None)
        if _pending is not None:
            _pending.release(_extra)
            _pending = None
        return _ctx


def start_child(target: Callable[..., None], args: tuple[Any, ...]) -> Any:
    """Start a daemon process forked from the forkserver (torch already imported there),
    without re-importing ``__main__``; the caller joins (or kills) it."""
    proc = forkserver_context().Process(target=target, args=args, daemon=True)
    with without_main_module():
        proc.start()
    return proc
