"""Persistent rank pools: start a process group once, run many instances on it.

One pool per (backend, device, world size, backend modules); ranks are forked from a
forkserver that preloads torch, so a new pool costs tens of milliseconds plus the backend's
rendezvous instead of seconds. The pool enforces the per-instance deadline, turns a hang or a
dead rank into a per-rank diagnosis (Python stacks via faulthandler, the step each rank was
in, flight-recorder entries, exit signal and last output), kills the ranks, and lets the
manager start a fresh pool for the next instance.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..model import Instance, PoolRun, RankState
from .rank import STACK_SIGNAL, RankConfig, rank_main

FAIL_FAST_GRACE_S = 2.0
STARTUP_TIMEOUT_S = 120.0
DIAGNOSE_WAIT_S = 2.0  # stacks and flight recorder, together
STDERR_TAIL_LINES = 20

_ctx_lock = threading.RLock()
_ctx: Any = None


@contextlib.contextmanager
def _without_main_module() -> Iterator[None]:
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

    with _ctx_lock:
        multiprocessing.spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            multiprocessing.spawn.get_preparation_data = original


def forkserver_context() -> Any:
    """The forkserver context every pool starts its ranks from (torch preloaded once)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["torch", "torch.distributed", "harness.program.interpreter",
                                          "harness.ordering.probes"])
            _ctx = ctx
        return _ctx


@dataclass(frozen=True)
class PoolKey:
    """What makes two instances able to share ranks."""

    backend: str
    device: str
    world_size: int
    backend_modules: tuple[str, ...] = ()
    isolated: int = 0  # non-zero: a private pool for one instance
    env: tuple[tuple[str, str], ...] = ()  # the case's environment (set before init)
    pg_timeout_s: float | None = None  # the case's process-group timeout


class PoolStartError(RuntimeError):
    """The ranks could not form a process group (bad backend, missing device, ...)."""


def _backend_env(backend: str, pg_timeout_s: float) -> tuple[tuple[str, str], ...]:
    env = {"TORCH_FR_BUFFER_SIZE": "256"}
    if backend == "nccl":
        # Let the harness's deadline, not the watchdog, notice hangs; keep a flight recorder.
        env.update({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_TRACE_BUFFER_SIZE": "256",
                    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_ENABLE_MONITORING": "0"})
    return tuple(sorted(env.items()))


class RankPool:
    """``world_size`` rank processes sharing one process group."""

    def __init__(self, key: PoolKey, pg_timeout_s: float = 600.0) -> None:
        self.key = key
        self.dir = tempfile.mkdtemp(prefix="collective-harness-")
        self.alive = False
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.progress: list[Any] = []
        ctx = forkserver_context()
        if key.pg_timeout_s is not None:
            pg_timeout_s = key.pg_timeout_s
        # The case's variables win over the harness's defaults for the backend.
        env = tuple(sorted({**dict(_backend_env(key.backend, pg_timeout_s)),
                            **dict(key.env)}.items()))
        self.fr_requests: list[Any] = []
        for r in range(key.world_size):
            parent_conn, child_conn = ctx.Pipe()
            fr_recv, fr_send = ctx.Pipe(duplex=False)
            progress = ctx.RawArray("i", 2)
            cfg = RankConfig(rank=r, world_size=key.world_size, backend=key.backend,
                             device=key.device, store_path=os.path.join(self.dir, "store"),
                             owner_pid=os.getpid(), log_path=self.log_path(r),
                             stack_path=self.stack_path(r), backend_modules=key.backend_modules,
                             pg_timeout_s=pg_timeout_s, fr_path=self.fr_path(r), env=env)
            proc = ctx.Process(target=rank_main, args=(cfg, child_conn, progress, fr_recv),
                               name=f"collective-rank{r}", daemon=True)
            with _without_main_module():
                proc.start()
            child_conn.close()
            fr_recv.close()
            self.fr_requests.append(fr_send)
            self.procs.append(proc)
            self.conns.append(parent_conn)
            self.progress.append(progress)
        _live_pools.add(self)
        self._await_ready()
        self.alive = True

    def log_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.log")

    def stack_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.stack")

    def fr_path(self, rank: int) -> str:
        return os.path.join(self.dir, f"rank{rank}.fr.json")

    def _await_ready(self) -> None:
        waiting = set(range(self.key.world_size))
        errors: list[str] = []
        end = time.monotonic() + STARTUP_TIMEOUT_S
        while waiting and time.monotonic() < end:
            objs = [self.conns[r] for r in waiting] + [self.procs[r].sentinel for r in waiting]
            for obj in multiprocessing.connection.wait(objs, timeout=end - time.monotonic()):
                r = self._rank_of(obj)
                if obj is self.procs[r].sentinel:
                    errors.append(f"rank {r} died while starting (exit code "
                                  f"{self.procs[r].exitcode}): {self._tail(r)}")
                    waiting.discard(r)
                    continue
                try:
                    msg = self.conns[r].recv()
                except EOFError:
                    continue
                waiting.discard(r)
                if msg[0] != "ready":
                    errors.append(f"rank {r}: {msg[1]}")
            if errors:
                break
        if waiting and not errors:
            errors.append(f"ranks {sorted(waiting)} did not join the process group within "
                          f"{STARTUP_TIMEOUT_S:.0f} s")
        if errors:
            self.kill()
            raise PoolStartError(
                f"could not start a {self.key.backend} process group of {self.key.world_size} "
                f"rank(s) on {self.key.device}: " + "; ".join(errors))

    def _rank_of(self, obj: Any) -> int:
        for r in range(self.key.world_size):
            if obj is self.conns[r] or obj == self.procs[r].sentinel:
                return r
        raise KeyError(obj)

    def _tail(self, rank: int) -> str:
        try:
            with open(self.log_path(rank), errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return ""
        lines = [ln for ln in lines if "Failed to initialize NumPy" not in ln
                 and not ln.startswith("Extension modules:")]
        fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")]
        if fatal:  # faulthandler's crash report: keep it whole, minus helper threads
            text = "\n".join(lines[fatal[-1]:fatal[-1] + 3 * STDERR_TAIL_LINES])
            head, _, rest = text.partition("\n\n")
            return (head + "\n\n" + _clean_stack(rest)).strip()
        return "\n".join(lines[-STDERR_TAIL_LINES:])

    def run(self, inst: Instance, deadline_s: float, grace_s: float = FAIL_FAST_GRACE_S) -> PoolRun:
        """Run ``inst`` on every rank; never blocks longer than the deadline plus a few s."""
        payload = pickle.dumps(("run", inst))
        t0 = time.monotonic()
        for c in self.conns:
            c.send_bytes(payload)
        pending = set(range(self.key.world_size))
        run = PoolRun(kind="done")
        end = t0 + deadline_s
        died: list[int] = []
        while pending:
            timeout = end - time.monotonic()
            if timeout <= 0:
                break
            objs = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            for obj in multiprocessing.connection.wait(objs, timeout=timeout):
                r = self._rank_of(obj)
                if r not in pending:
                    continue
                if obj is self.conns[r]:
                    try:
                        _, result = pickle.loads(self.conns[r].recv_bytes())
                    except (EOFError, OSError):
                        continue  # the sentinel will tell us it died
                    run.results[r] = result
                    pending.discard(r)
                    if result.status == "raised" and pending:
                        end = min(end, time.monotonic() + grace_s)
                        run.kind = "failfast"
                else:
                    pending.discard(r)
                    died.append(r)
                    end = min(end, time.monotonic() + min(grace_s, 1.0))
        run.elapsed = time.monotonic() - t0
        if died:
            run.kind = "crash"
        elif pending and run.kind != "failfast":
            run.kind = "hang"
        if not pending and not died:
            if run.kind == "failfast":  # everyone reported after all
                run.kind = "done"
            return run
        run.states = self._diagnose(inst, pending, died, run)
        self.kill()
        return run

    def _diagnose(self, inst: Instance, pending: set[int], died: list[int],
                  run: PoolRun) -> list[RankState]:
        sizes = {r: _size(self.stack_path(r)) for r in pending}
        for r in pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.procs[r].pid, STACK_SIGNAL)
            with contextlib.suppress(OSError):
                self.fr_requests[r].send_bytes(b"dump")
        end = time.monotonic() + DIAGNOSE_WAIT_S
        stacks = _read_grown(self, sizes, end)
        recorder = self._read_flight_recorder(pending, end)
        states: list[RankState] = []
        for r in range(self.key.world_size):
            if r in run.results:
                res = run.results[r]
                states.append(RankState(r, "raised" if res.status == "raised" else "finished",
                                        step=res.step))
                continue
            step = self.progress[r][1]
            desc = inst.steps[step].describe() if 0 <= step < len(inst.steps) else (
                "building buffers" if step == -1 else "checking results")
            if r in died:
                proc = self.procs[r]
                proc.join(1.0)
                code = proc.exitcode
                sig = signal.Signals(-code).name if code is not None and code < 0 else ""
                states.append(RankState(r, "died", step=step, step_desc=desc, exitcode=code,
                                        signal=sig, stderr_tail=self._tail(r)))
            else:
                states.append(RankState(r, "blocked", step=step, step_desc=desc,
                                        stack=_clean_stack(stacks.get(r, "")),
                                        flight_recorder=recorder.get(r, [])))
        return states

    def _read_flight_recorder(self, ranks: set[int], end: float) -> dict[int, list[str]]:
        """The last collectives each blocked rank's flight recorder saw (best effort)."""
        out: dict[int, list[str]] = {}
        while time.monotonic() < end and len(out) < len(ranks):
            for r in ranks - set(out):
                try:
                    with open(self.fr_path(r)) as fh:
                        out[r] = summarize_flight_recorder(json.load(fh))
                except (OSError, ValueError):
                    continue
            if len(out) < len(ranks):
                time.sleep(0.05)
        return out

    def ping(self, timeout_s: float = 5.0) -> bool:
        """A barrier across the pool: False if any rank does not answer in time."""
        payload = pickle.dumps(("ping", None))
        for c in self.conns:
            c.send_bytes(payload)
        end = time.monotonic() + timeout_s
        pending = set(range(self.key.world_size))
        while pending and time.monotonic() < end:
            for obj in multiprocessing.connection.wait([self.conns[r] for r in pending],
                                                       timeout=end - time.monotonic()):
                r = self._rank_of(obj)
                try:
                    kind, _ = pickle.loads(self.conns[r].recv_bytes())
                except (EOFError, OSError):
                    return False
                if kind != "pong":
                    return False
                pending.discard(r)
        return not pending

    def kill(self) -> None:
        """Kill every rank now and remove the pool's files."""
        self.alive = False
        for p in self.procs:
            if p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.join(2.0)
        for c in self.conns:
            c.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        _live_pools.discard(self)

    def close(self) -> None:
        """Stop the ranks politely (destroy the process group), then make sure they are gone."""
        if self.alive:
            payload = pickle.dumps(("stop", None))
            for c in self.conns:
                with contextlib.suppress(OSError):
                    c.send_bytes(payload)
            end = time.monotonic() + 2.0
            for p in self.procs:
                p.join(max(0.0, end - time.monotonic()))
        self.kill()


def summarize_flight_recorder(dump: dict[str, Any], last: int = 8) -> list[str]:
    """One line per recent flight-recorder entry: sequence ids, op, sizes, state."""
    if "error" in dump:
        return [f"flight recorder unavailable: {dump['error']}"]
    lines: list[str] = []
    for e in dump.get("entries", [])[-last:]:
        lines.append(f"pg {e.get('pg_id', '?')} coll#{e.get('collective_seq_id', '?')} "
                     f"p2p#{e.get('p2p_seq_id', '?')} {e.get('profiling_name', '?')} "
                     f"in={e.get('input_sizes', '?')} out={e.get('output_sizes', '?')} "
                     f"state={e.get('state', '?')}")
    return lines


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_grown(pool: RankPool, sizes: dict[int, int], end: float) -> dict[int, str]:
    """Wait until each signalled rank's stack dump has been written, then read it."""
    out: dict[int, str] = {}
    last: dict[int, int] = {}
    while time.monotonic() < end:
        done = True
        for r, start in sizes.items():
            now = _size(pool.stack_path(r))
            if now <= start or last.get(r) != now:
                done = False
            last[r] = now
        if done:
            break
        time.sleep(0.05)
    for r, start in sizes.items():
        try:
            with open(pool.stack_path(r), errors="replace") as fh:
                fh.seek(start)
                out[r] = fh.read()
        except OSError:
            out[r] = ""
    return out


def _clean_stack(text: str) -> str:
    """Keep the thread that runs the program; drop the harness's helper threads and the
    multiprocessing frames below the rank's main loop."""
    blocks = [b.strip() for b in text.strip().split("\n\n") if b.strip()]
    main = [b for b in blocks if "in rank_main" in b] or blocks
    out: list[str] = []
    for block in main:
        lines = block.splitlines()
        cut = next((i for i, ln in enumerate(lines) if "in rank_main" in ln), len(lines) - 1)
        out.append("\n".join(lines[: cut + 1]))
    return "\n\n".join(out)


class PoolManager:
    """Hands out pools by key, reusing them; keeps at most ``max_pools`` alive (LRU)."""

    def __init__(self, max_pools: int = 2, pg_timeout_s: float = 600.0) -> None:
        self.max_pools = max_pools
        self.pg_timeout_s = pg_timeout_s
        self.pools: OrderedDict[PoolKey, RankPool] = OrderedDict()
        self.started = 0
        self._isolated = 0

    def get(self, key: PoolKey) -> RankPool:
        pool = self.pools.get(key)
        if pool is not None and pool.alive:
            self.pools.move_to_end(key)
            return pool
        if pool is not None:
            del self.pools[key]
        while len(self.pools) >= self.max_pools:
            _, old = self.pools.popitem(last=False)
            old.close()
        pool = RankPool(key, self.pg_timeout_s)
        self.started += 1
        self.pools[key] = pool
        return pool

    def isolated(self, key: PoolKey) -> RankPool:
        """A private pool for one instance; the caller closes it."""
        self._isolated += 1
        self.started += 1
        return RankPool(PoolKey(key.backend, key.device, key.world_size, key.backend_modules,
                                self._isolated, key.env, key.pg_timeout_s), self.pg_timeout_s)

    def discard(self, key: PoolKey) -> None:
        pool = self.pools.pop(key, None)
        if pool is not None:
            pool.kill()

    def close(self) -> None:
        while self.pools:
            _, pool = self.pools.popitem()
            pool.close()


_live_pools: set[RankPool] = set()


@atexit.register
def _kill_leftovers() -> None:
    for pool in list(_live_pools):
        pool.kill()
