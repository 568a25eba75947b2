"""Whatever a rank starts ends with the rank: its process group and its keeper.

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
  its end, and a backend's child has no reason to notice. So :func:`lead_group` forks a keeper
  from the rank before any thread exists: a small process in the rank's group that holds
  ``PR_SET_PDEATHSIG`` on the rank and, when the rank is gone, kills the group, itself
  included. It does nothing else, holds none of the rank's descriptors (the pool's pipes see
  the rank's end, not the keeper's), and costs one fork of the rank per pool start.

A rank's group is killed with SIGKILL only: there is nothing to flush in a rank, and a
backend's helper that must clean up after itself does so when its rank stops politely
(``destroy_process_group``), before the keeper sees the rank go.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# The keeper waits for this signal, which the kernel sends it when the rank dies; anyone else
# sending it (a SIGTERM to the rank's group) ends the group the same way.
RANK_GONE = signal.SIGTERM


def _prctl(option: int, arg: int | bytes) -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False
    return bool(libc.prctl(option, arg, 0, 0, 0) == 0)


def lead_group(rank: int) -> int:
    """Make the calling rank the leader of a new process group and fork its keeper; returns
    the keeper's pid (0 where it could not be started: then only the pool's kill ends the
    rank's children). Call before any thread is started."""
    with contextlib.suppress(OSError):  # already a leader (started by a test on its own)
        os.setpgid(0, 0)
    rank_pid = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        return 0
    if pid == 0:
        _keep(rank, rank_pid)  # never returns
    return pid


def _keep(rank: int, rank_pid: int) -> None:
    """The keeper's whole life: wait for the rank's end, then kill the rank's group."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {RANK_GONE})
        _prctl(PR_SET_NAME, f"coll-keeper{rank}".encode()[:15])
        armed = _prctl(PR_SET_PDEATHSIG, RANK_GONE)
        # Nothing of the rank's: the pool sees the end of a rank's pipes when the rank ends,
        # and a reader of pytest's output its end of file when pytest's processes end.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 1 << 20)
    except BaseException:
        os._exit(1)  # no keeper, but never a rank killed for the keeper's own failure
    if not armed:
        os._exit(1)
    # The rank may have died before the death signal was armed: then it never comes.
    if os.getppid() == rank_pid:
        with contextlib.suppress(BaseException):
            signal.sigwait({RANK_GONE})
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGKILL)
    os._exit(0)


def kill_group(pid: int) -> None:
    """SIGKILL the rank ``pid`` with every process in its group (its keeper, whatever it
    started); the rank itself too if it had not made its group yet."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
