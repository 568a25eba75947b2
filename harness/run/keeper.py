"""Whatever a rank starts ends with the rank: its process group and the owner's keeper.

A backend may start processes of its own from a rank: torchft's ``ProcessGroupBabyGloo`` runs
its collectives in a worker it starts with ``multiprocessing``. Ranks are therefore ordinary
(not daemonic) ``multiprocessing`` processes, since Python forbids a daemonic one to have
children, and the harness, not multiprocessing's exit handler, is what ends them. Two things
make everything a rank starts end with it, whatever happens:

* Each rank leads a process group of its own (:func:`lead_group`, the first thing a rank
  does, before it imports a backend), which its children and their children join unless they
  leave it on purpose (``setsid``/``setpgid``: a backend that does so ends its helpers itself).
  The pool kills the whole group (:func:`kill_group`) where it used to kill the rank: a hang
  past its deadline, a rank that died, a failed start, Ctrl-C, the session's end.
* A rank that dies on its own (a crash, an ``os._exit``, SIGKILL from outside, or the
  ``PR_SET_PDEATHSIG`` that follows pytest's death through the forkserver's) runs nothing at
  its end, a backend's child has no reason to notice, and an idle pool does not look. So the
  process that owns pools (pytest, an xdist worker, the fuzzer) starts one keeper, on its
  first pool: a small standard-library-only Python process (``coll-keeper`` in ``ps``) told
  each rank's pid (:func:`watch`). It holds a pidfd on every rank and on its owner; when a
  rank is gone it kills the rank's group at once, and when the owner is gone it kills every
  group it still watches and exits. It holds none of its owner's descriptors but the end of
  its own pipe, so a reader of pytest's output sees end of file when pytest ends.

One keeper per owner, not per rank: a keeper forked from each rank (the first version) cost
about 2 ms of the rank's start for the fork of a process with torch loaded, plus about 4 ms of
the keeper's CPU, per rank and pool start; the quick suite starts several hundred.

A rank's group is killed with SIGKILL only: there is nothing to flush in a rank, and a
backend's helper that must clean up after itself does so when its rank stops politely
(``destroy_process_group``), before the keeper sees the rank go.

This file runs as the keeper itself (``python -I -S keeper.py OWNER_PID``), so it imports
nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading

PR_SET_NAME = 15
# Without pidfds (Linux before 5.3) the keeper looks at its ranks and owner this often.
POLL_S = 0.25


def lead_group() -> None:
    """Make the calling rank the leader of a new process group, which whatever it starts
    joins (then :func:`kill_group` ends them together)."""
    with contextlib.suppress(OSError):  # already a leader (started by a test on its own)
        os.setpgid(0, 0)


def kill_group(pid: int) -> None:
    """SIGKILL the rank ``pid`` with every process in its group (whatever it started); the
    rank itself too if it had not made its group yet."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# The owner's side: one keeper per process, started on the first watch(); a process forked
# from its owner (os.getpid() differs) starts its own.
_lock = threading.Lock()
_keeper: subprocess.Popen[bytes] | None = None
_keeper_owner = 0


def _start_keeper() -> subprocess.Popen[bytes] | None:
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=True, bufsize=0)
    except OSError:
        return None  # no keeper: the pool's own kills still end the ranks it sees end


def watch(pid: int) -> None:
    """Have this process's keeper kill rank ``pid``'s group when the rank ends, or when this
    process does; starts the keeper on first use. Safe from several threads."""
    global _keeper, _keeper_owner
    with _lock:
        for _attempt in range(2):  # a keeper that died is started again, once
            if _keeper is None or _keeper_owner != os.getpid() or _keeper.poll() is not None:
                _keeper, _keeper_owner = _start_keeper(), os.getpid()
            if _keeper is None or _keeper.stdin is None:
                return
            try:
                _keeper.stdin.write(f"{pid}\n".encode())
                return
            except OSError:
                _keeper = None


# The keeper's side.

def _pidfd(pid: int) -> int | None:
    """A pidfd on ``pid``, None where the system has none; raises ProcessLookupError if
    ``pid`` is gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except (OSError, AttributeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pids(buffered: bytes, chunk: bytes) -> tuple[list[int], bytes]:
    """The pids in ``buffered + chunk`` (one per line) and what is left of an unended line."""
    lines = (buffered + chunk).split(b"\n")
    rest = lines.pop()[:32]
    return [int(line) for line in lines if line.strip().isdigit()], rest


def _serve(owner: int) -> None:
    """The keeper's whole life: watch the ranks its owner names until the owner is gone."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # Ctrl-C and a terminal's hangup reach the owner's whole process group; the owner
        # handles them, and the keeper must outlive it to clean up after a hard death.
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").prctl(PR_SET_NAME, b"coll-keeper", 0, 0, 0)
    ranks: dict[int, int | None] = {}  # rank pid -> its pidfd (None: looked at every POLL_S)
    by_fd: dict[int, int] = {}
    poller = select.poll()
    poller.register(0, select.POLLIN)
    buffered = b""

    def watch_all(pids: list[int]) -> None:
        for pid in pids:
            try:
                fd = _pidfd(pid)
            except ProcessLookupError:
                kill_group(pid)  # gone before it was watched: its group may not be
                continue
            ranks[pid] = fd
            if fd is not None:
                by_fd[fd] = pid
                poller.register(fd, select.POLLIN)

    try:
        owner_fd = _pidfd(owner)
    except ProcessLookupError:
        owner_fd = None
    if owner_fd is not None:
        poller.register(owner_fd, select.POLLIN)
    # The owner may be gone already, even before this process ran (a busy machine): then
    # the loop does not run and what it wrote is read below.
    while os.getppid() == owner:
        polled = any(fd is None for fd in ranks.values()) or owner_fd is None
        events = poller.poll(int(POLL_S * 1000) if polled else None)
        if owner_fd is not None and any(fd == owner_fd for fd, _ in events):
            break
        if any(fd == 0 for fd, _ in events):
            chunk = os.read(0, 4096)
            if not chunk:
                break  # the owner is gone (or closed its end: it wants its ranks ended)
            pids, buffered = _pids(buffered, chunk)
            watch_all(pids)
        gone = [by_fd[fd] for fd, _ in events if fd in by_fd]
        gone += [pid for pid, fd in ranks.items() if fd is None and not _alive(pid)]
        for pid in gone:
            kill_group(pid)
            fd = ranks.pop(pid, None)
            if fd is not None:
                poller.unregister(fd)
                del by_fd[fd]
                os.close(fd)
    # The owner is gone: the ranks it named and this process had not read yet count too
    # (the pipe holds them until read; a process the owner forked may hold its end open,
    # so the pipe is read without waiting).
    os.set_blocking(0, False)
    with contextlib.suppress(OSError):
        while chunk := os.read(0, 65536):
            pids, buffered = _pids(buffered, chunk)
            ranks.update(dict.fromkeys(pids))
    for pid in ranks:
        kill_group(pid)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
