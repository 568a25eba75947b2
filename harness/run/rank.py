"""The rank process: join the process group once, then run instances until told to stop.

Started by :mod:`harness.run.pool` through a forkserver that has torch preloaded. A rank must
never outlive the pytest process that owns it: it dies with its parent (PDEATHSIG), polls the
owner's pid from a watchdog thread, and ignores Ctrl-C (the owner handles it and kills us).
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import importlib
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

STACK_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class RankConfig:
    """Everything a rank needs to start (sent once, at process start)."""

    rank: int
    world_size: int
    backend: str
    device: str
    store_path: str
    owner_pid: int
    log_path: str
    stack_path: str
    backend_modules: tuple[str, ...]
    pg_timeout_s: float
    fr_path: str = ""
    env: tuple[tuple[str, str], ...] = ()


def _die_with_owner(owner_pid: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed when the forkserver goes
    except OSError:
        pass

    def watch() -> None:
        while True:
            try:
                os.kill(owner_pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:
                pass
            time.sleep(0.25)

    threading.Thread(target=watch, name="owner-watchdog", daemon=True).start()


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


FR_ENTRIES = 8


def _serve_flight_recorder(fr_path: str, requests: Any) -> None:
    """On request, write the flight recorder's last entries to ``fr_path``.

    Runs in its own thread because the main thread is the one stuck in a collective when the
    parent asks; c10d releases the GIL while it waits, so this thread still runs.
    """

    def serve() -> None:
        while True:
            try:
                requests.recv_bytes()
            except (EOFError, OSError):
                return
            try:
                from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
                    _dump_fr_trace_json,
                )

                raw = _dump_fr_trace_json(True, False)
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
            except Exception as exc:  # older torch, or recorder off: say so in the report
                text = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
            tmp = fr_path + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, fr_path)

    threading.Thread(target=serve, name="flight-recorder", daemon=True).start()


def _name_process(name: str) -> None:
    """Show up as ``name`` in ps/top (and /proc/PID/comm), so a stray rank is recognisable."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except OSError:
        pass


def rank_main(cfg: RankConfig, conn: Any, progress: Any, fr_requests: Any = None) -> None:
    """Entry point of a rank process (the target given to the forkserver)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _name_process(f"coll-rank{cfg.rank}")
    _die_with_owner(cfg.owner_pid)
    _redirect_output(cfg.log_path)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a segfault leaves its stack
    stack_file = open(cfg.stack_path, "w")  # noqa: SIM115 - kept open for faulthandler
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    for key, value in cfg.env:
        os.environ[key] = value
    if fr_requests is not None and cfg.fr_path:
        _serve_flight_recorder(cfg.fr_path, fr_requests)
    try:
        import torch
        import torch.distributed as dist

        from ..ordering.probes import run_probes
        from ..program.interpreter import RankEnv, run_instance

        if any(k == "TORCH_DISTRIBUTED_DEBUG" for k, _ in cfg.env):
            # torch reads the debug level when torch.distributed is first imported, which may
            # have happened in the forkserver before this rank's environment was set.
            dist.set_debug_level_from_env()  # type: ignore[attr-defined]
        for mod in cfg.backend_modules:
            importlib.import_module(mod)
        if cfg.device == "cuda":
            torch.cuda.set_device(cfg.rank % max(1, torch.cuda.device_count()))
        store = dist.FileStore(cfg.store_path, cfg.world_size)  # type: ignore[attr-defined]
        dist.init_process_group(cfg.backend, store=store, rank=cfg.rank,
                                world_size=cfg.world_size,
                                timeout=datetime.timedelta(seconds=cfg.pg_timeout_s))
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    renv = RankEnv(rank=cfg.rank, world_size=cfg.world_size, device=cfg.device,
                   progress=progress)
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        kind, payload = pickle.loads(msg)
        if kind == "run":
            renv.seq += 1
            progress[0] = renv.seq
            progress[1] = -1
            result = run_instance(payload, renv, run_probes)
            progress[1] = -2
            conn.send_bytes(pickle.dumps(("result", result)))
        elif kind == "ping":
            try:
                dist.barrier()
                conn.send_bytes(pickle.dumps(("pong", None)))
            except Exception as exc:
                conn.send_bytes(pickle.dumps(("failed", str(exc))))
        elif kind == "stop":
            try:
                dist.destroy_process_group()
            finally:
                os._exit(0)
