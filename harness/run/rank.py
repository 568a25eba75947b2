"""The rank process: join the process group once, then run instances until told to stop.

Started by :mod:`harness.run.pool` through a forkserver that has torch preloaded. A rank must
never outlive the pytest process that owns it: it dies with its parent (PDEATHSIG), polls the
owner's pid from a watchdog thread, and ignores Ctrl-C (the owner handles it and kills us).
Whatever a rank starts (a backend's worker process) ends with it: the rank leads a process
group of its own, watched by a keeper (:mod:`harness.run.keeper`).
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

from ..model import BUILDING_BUFFERS, CHECKING_RESULTS
from . import keeper

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
    nonce: str = ""  # the pool's identity: every message in either direction carries it
    bind_device: bool = False  # init_process_group(device_id=this rank's GPU)


# Every message, in either direction, is ``(kind, nonce, seq, payload)``: the pool's nonce and
# the number of the request it belongs to (0 for the start-up message). A rank answers a
# request with the same nonce and seq, so the parent can tell an answer to an earlier request
# (left unread when the parent failed after sending) from the answer it asked for.
Message = tuple[str, str, int, Any]


def encode(kind: str, nonce: str, seq: int, payload: Any) -> bytes:
    """One message of the pool protocol, ready for ``send_bytes``."""
    return pickle.dumps((kind, nonce, seq, payload))


def decode(raw: bytes) -> Message:
    """A message of the pool protocol; ValueError for anything else."""
    msg = pickle.loads(raw)
    if not (isinstance(msg, tuple) and len(msg) == 4 and isinstance(msg[0], str)
            and isinstance(msg[1], str) and isinstance(msg[2], int)):
        raise ValueError(f"not a pool message: {str(msg)[:200]}")
    return msg


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


def health_answer(cfg: RankConfig, seq: int) -> bytes:
    """Prove the group is in step after an instance in which a rank raised.

    A barrier, then an all_gather of ``(seq, nonce, rank)`` that must bring back exactly those
    rows from every rank: a rank that is a collective ahead or behind, a message of an earlier
    collective still in the pipe, or a broken communicator shows up as other values, an
    exception, or no answer before the parent's short deadline.
    """
    import torch
    import torch.distributed as dist

    try:
        dist.barrier()
        device = "cpu" if cfg.backend == "gloo" else cfg.device
        tag = int(cfg.nonce[:8] or "0", 16)
        mine = torch.tensor([seq, tag, cfg.rank], dtype=torch.int64, device=device)
        rows = [torch.zeros_like(mine) for _ in range(cfg.world_size)]
        dist.all_gather(rows, mine)
        got = [row.tolist() for row in rows]
        want = [[seq, tag, r] for r in range(cfg.world_size)]
        if got != want:
            return encode("unhealthy", cfg.nonce, seq,
                          f"all_gather returned {str(got)[:200]}, expected {str(want)[:200]}")
    except Exception as exc:
        return encode("unhealthy", cfg.nonce, seq, f"{type(exc).__name__}: {str(exc)[:200]}")
    return encode("healthy", cfg.nonce, seq, None)


def rank_main(cfg: RankConfig, conn: Any, progress: Any, fr_requests: Any = None) -> None:
    """Entry point of a rank process (the target given to the forkserver)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _name_process(f"coll-rank{cfg.rank}")
    keeper.lead_group()  # before a backend could start anything
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
        from ..program.interpreter import RankEnv
        from ..program.perf import time_instance
        from ..program.reruns import run as run_instance

        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            # OpenMP read the variable when the forkserver loaded torch, before this rank's
            # environment was set (harness.run.pool chooses the value).
            torch.set_num_threads(int(threads))
        if any(k == "TORCH_DISTRIBUTED_DEBUG" for k, _ in cfg.env):
            # torch reads the debug level when torch.distributed is first imported, which may
            # have happened in the forkserver before this rank's environment was set.
            dist.set_debug_level_from_env()  # type: ignore[attr-defined]
        for mod in cfg.backend_modules:
            importlib.import_module(mod)
        if cfg.device == "cuda":
            torch.cuda.set_device(cfg.rank % max(1, torch.cuda.device_count()))
        store = dist.FileStore(cfg.store_path, cfg.world_size)  # type: ignore[attr-defined]
        bound: dict[str, Any] = {}
        if cfg.bind_device and cfg.device == "cuda":
            bound["device_id"] = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group(cfg.backend, store=store, rank=cfg.rank,
                                world_size=cfg.world_size,
                                timeout=datetime.timedelta(seconds=cfg.pg_timeout_s), **bound)
    except BaseException as exc:
        conn.send_bytes(encode("failed", cfg.nonce, 0, (f"{type(exc).__name__}: {exc}",
                                                          traceback.format_exc())))
        return
    conn.send_bytes(encode("ready", cfg.nonce, 0, os.getpid()))
    renv = RankEnv(rank=cfg.rank, world_size=cfg.world_size, device=cfg.device,
                   progress=progress, store_path=cfg.store_path, pg_timeout_s=cfg.pg_timeout_s,
                   pool_world_size=cfg.world_size)
    last_seq = 0
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        try:
            kind, nonce, seq, payload = decode(raw)
        except Exception as exc:
            conn.send_bytes(encode("rejected", cfg.nonce, -1, f"undecodable request: {exc}"))
            continue
        if nonce != cfg.nonce or seq <= last_seq:
            # Not a request of this pool, or one out of order: answer nothing else, so the
            # parent discards the pool instead of reading a result for the wrong request.
            conn.send_bytes(encode("rejected", cfg.nonce, seq,
                                   f"request #{seq} of pool {nonce!r} after #{last_seq} of "
                                   f"pool {cfg.nonce!r}"))
            continue
        last_seq = seq
        if kind == "run":
            renv.seq = seq
            progress[0] = seq
            progress[1] = BUILDING_BUFFERS
            result = run_instance(payload, renv, run_probes, time_instance)
            progress[1] = CHECKING_RESULTS
            conn.send_bytes(encode("result", cfg.nonce, seq, (payload.key, result)))
        elif kind == "health":
            conn.send_bytes(health_answer(cfg, seq))
        elif kind == "stop":
            try:
                dist.destroy_process_group()
            finally:
                os._exit(0)
