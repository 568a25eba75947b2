"""What a rank started by a cluster launcher needs: its place, a process group, a watchdog.

Used by :mod:`harness.external`. The launcher (torchrun / torch.distributed.elastic,
SLURM's srun, mpirun) says who a rank is through environment variables; the rank joins a
process group through a store of this launch's own; a watchdog ends a rank whose instance
outlives its deadline, since there is no pool around it to do so.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from .progress import State

EXIT_HANG = 124  # a rank's deadline passed
EXIT_GRACE_S = 3.0


def env_int(*names: str, default: int | None = None) -> int:
    """First integer among the launcher variables (torchrun, SLURM, Open MPI, PMI)."""
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    if default is None:
        raise SystemExit(f"external mode needs one of {', '.join(names)} in the environment: "
                         "start it with torchrun, srun or mpirun")
    return default


class Watchdog:
    """Ends this rank when the instance it runs (or the round it waits for) outlives its
    deadline: there is no pool to recover it, so the launcher restarts the ranks."""

    def __init__(self, rank: int, state: State,
                 last_words: Callable[[], object] | None = None) -> None:
        self.rank = rank
        self.state = state
        self.last_words = last_words  # rank 0: write the report of what finished
        self.deadline = float("inf")
        self.current = ""
        threading.Thread(target=self._watch, name="external-watchdog", daemon=True).start()

    def arm(self, what: str, at: float) -> None:
        self.current, self.deadline = what, at

    def disarm(self) -> None:
        self.deadline = float("inf")

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            if time.monotonic() > self.deadline:
                print(f"collective-harness: rank {self.rank}: HANG in {self.current}: "
                      "deadline passed; this rank's stack follows", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                frame = sys._current_frames().get(threading.main_thread().ident or 0)
                stack = "".join(traceback.format_stack(frame)) if frame else "(no stack)"
                self.state.write_text("hang", stack)
                if self.last_words is not None:
                    with contextlib.suppress(Exception):  # the stack is written already
                        self.last_words()
                # The first rank to exit makes the launcher stop the rest: let the other
                # ranks stuck in this instance reach their own deadline and dump too.
                time.sleep(EXIT_GRACE_S)
                os._exit(EXIT_HANG)


class StepTrace:
    """Stands in for the pools' shared progress array: the step a rank is in, on disk."""

    def __init__(self, state: State, round_index: int) -> None:
        self.state, self.round = state, round_index

    def __setitem__(self, index: int, value: int) -> None:
        if index == 1:
            self.state.trace(self.round, value)


def join(dist: Any, backend: str, rank: int, world: int, timeout_s: float) -> None:
    """init_process_group through a store of this launch's own.

    The launcher's store outlives a restart, and keys a previous launch left there must not
    be read again (seen with Gloo after new_group: the restarted ranks read dead peers'
    addresses and fail with "connectFullMesh ... Connection refused"). Rank 0 therefore
    starts a fresh store on a free port and announces it, with a token, through the
    launcher's store; the other ranks take the announcement only once they reach a live
    store holding that token (an announcement left by a dead launch leads nowhere).
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(host, port, world, is_master=rank == 0 and not agent, timeout=timeout,
                         multi_tenant=True)
    key = "collective-harness/store"
    if rank == 0:
        token = uuid.uuid4().hex
        own = dist.TCPStore(host, 0, world, is_master=True, timeout=timeout,
                            wait_for_workers=False)
        own.set("token", token)
        base.set(key, f"{own.port} {token}")
    else:
        end = time.monotonic() + timeout_s
        while True:
            own_port, token = base.get(key).decode().split()
            try:
                own = dist.TCPStore(host, int(own_port), world, is_master=False,
                                    timeout=datetime.timedelta(seconds=5))
                if own.get("token").decode() == token:
                    break
            except (RuntimeError, OSError, ValueError):
                pass
            if time.monotonic() > end:
                raise RuntimeError("rank 0 never announced a live store (is rank 0 up?)")
            time.sleep(0.2)
    dist.init_process_group(backend, store=own, rank=rank, world_size=world, timeout=timeout)
