"""Persistent rank pools: start a process group once, run many instances on it.

One pool per (backend, device, world size, backend modules); ranks are forked from a
forkserver that preloads torch, so a new pool costs tens of milliseconds plus the backend's
rendezvous instead of seconds. The pool enforces the per-instance deadline, turns a hang or a
dead rank into a per-rank diagnosis (Python stacks via faulthandler, the step each rank was
in, flight-recorder entries, exit signal and last output), kills the ranks, and lets the
manager start a fresh pool for the next instance.

Kept whole: the pool's request/answer protocol, its deadline handling and its teardown are one
state machine over the same pipes and processes; split, each half would have to reach into the
other's state (which request is outstanding, which rank is alive) to stay correct.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.spawn
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import ops
from ..model import Instance, PoolRun, RankState, flat_steps, phase
from . import keeper, ranklog, stranded
from .forkserver import forkserver_context, without_main_module
from .overdue import POLL_S, Overdue
from .rank import STACK_SIGNAL, RankConfig, decode, encode, rank_main

FAIL_FAST_GRACE_S = 2.0
STARTUP_TIMEOUT_S = 120.0
DIAGNOSE_WAIT_S = 2.0  # stacks and flight recorder, together
HEALTH_DEADLINE_S = 3.0  # the check takes about a millisecond; this only bounds a broken group
# multiprocessing's wait() turns its timeout into an int of milliseconds for poll(): wait in
# slices so that any finite deadline works.
WAIT_SLICE_S = 3600.0
# A person watching a run hears about an instance that waits longer than this (and then every
# PROGRESS_EVERY_S): which rank is in which step, and the time left to the deadline.
PROGRESS_AFTER_S = 5.0
PROGRESS_EVERY_S = 15.0

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
    # init_process_group(device_id=...): the default group is bound to the rank's GPU, which
    # split_group needs (programs with a split step on CUDA; see Instance.bind_device).
    bind_device: bool = False


# How a start failure's message begins, whatever instance met it (harness.certify.cells
# groups such failures as one cause, not one per case).
START_FAILED = "could not start a "


class PoolStartError(RuntimeError):
    """The ranks could not form a process group (bad backend, missing device, ...).

    ``causes``: what each rank that failed said, one entry per rank, in the order they were
    heard (the start breaker, :mod:`harness.runner.starts`, compares them from one try to the
    next: which rank fails first varies, the cause does not)."""

    def __init__(self, message: str, causes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.causes = causes


class ForeignAnswerError(RuntimeError):
    """A rank answered with a message that does not belong to the request the parent made.

    The pool has been killed when this is raised: nothing it sends can be trusted any more.
    The caller re-runs the instance on a fresh pool or reports a harness error; the answer is
    never judged.
    """


def check_deadline(deadline_s: float) -> None:
    """ValueError unless ``deadline_s`` is a positive, finite number of seconds."""
    if not (isinstance(deadline_s, int | float) and math.isfinite(deadline_s)
            and deadline_s > 0):
        raise ValueError(f"a deadline must be a positive, finite number of seconds; got "
                         f"{deadline_s!r}")


def _backend_env(backend: str, pg_timeout_s: float) -> tuple[tuple[str, str], ...]:
    # One intra-op thread per rank unless the user's environment (or the case's env:) says
    # otherwise, as torchrun does for several processes per node: ranks share the machine's
    # cores, and torch's default (a thread per core in every rank) made OpenMP threads spin
    # against each other (a 100,003-element all_reduce check at world size 4 on 2 cores:
    # 0.68 s, 0.11 s with one thread). Gloo's own reductions do not use these threads.
    env = {"TORCH_FR_BUFFER_SIZE": "256",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or "1"}
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
        # Every message carries the pool's nonce and the number of the request it belongs to.
        self.nonce = os.urandom(8).hex()
        self.seq = 0
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.progress: list[Any] = []
        ctx = forkserver_context()
        if key.pg_timeout_s is not None:
            pg_timeout_s = key.pg_timeout_s
        self.pg_timeout_s = pg_timeout_s
        # The case's variables win over the harness's defaults for the backend.
        env = tuple(sorted({**dict(_backend_env(key.backend, pg_timeout_s)),
                            **dict(key.env)}.items()))
        self.fr_requests: list[Any] = []
        self.log_starts = [0] * key.world_size  # see _run
        # The first instance that failed or in which a rank raised on these ranks, while they
        # were kept (harness.runner.execute runs a later failure again on fresh ranks).
        self.first_bad = ""
        # kill() runs once: a run-ahead thread and the session's close may both call it, and
        # closing a pipe twice could close a descriptor another thread has opened since.
        self._kill_lock = threading.Lock()
        self._killed = False
        # Listed before the first rank starts: a session that fails while starting them
        # still kills the ones already started (kill_leftovers).
        _live_pools.add(self)
        try:
            self._start_ranks(ctx, env)
        except BaseException:
            self.kill()
            raise
        self._await_ready()
        self.alive = True

    def _start_ranks(self, ctx: Any, env: tuple[tuple[str, str], ...]) -> None:
        key, pg_timeout_s = self.key, self.pg_timeout_s
        for r in range(key.world_size):
            parent_conn, child_conn = ctx.Pipe()
            fr_recv, fr_send = ctx.Pipe(duplex=False)
            progress = ctx.RawArray("i", 2)
            cfg = RankConfig(rank=r, world_size=key.world_size, backend=key.backend,
                             device=key.device, store_path=os.path.join(self.dir, "store"),
                             owner_pid=os.getpid(), log_path=self.log_path(r),
                             stack_path=self.stack_path(r), backend_modules=key.backend_modules,
                             pg_timeout_s=pg_timeout_s, fr_path=self.fr_path(r), env=env,
                             nonce=self.nonce, bind_device=key.bind_device)
            # Not daemonic: a rank may start processes of its own (a backend's worker), which
            # Python forbids a daemonic process. The pool, not multiprocessing's exit
            # handler, ends ranks: kill(), and kill_leftovers, registered after
            # multiprocessing's handler and so run before it joins its children.
            proc = ctx.Process(target=rank_main, args=(cfg, child_conn, progress, fr_recv),
                               name=f"collective-rank{r}", daemon=False)
            # Listed before it starts: a KeyboardInterrupt (SIGTERM) right after the start left
            # an unlisted rank that kill() missed and multiprocessing's exit handler joined while
            # it waited for its peers, up to the process-group timeout (a 600 s session end).
            self.procs.append(proc)
            with without_main_module():
                proc.start()
            keeper.watch(proc.pid)
            child_conn.close()
            fr_recv.close()
            self.fr_requests.append(fr_send)
            self.conns.append(parent_conn)
            self.progress.append(progress)

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
                    kind, nonce, seq, payload = decode(self.conns[r].recv_bytes())
                except (EOFError, OSError):
                    continue
                except ValueError as exc:
                    kind, nonce, seq, payload = "failed", self.nonce, 0, (str(exc), "")
                waiting.discard(r)
                if (nonce, seq) != (self.nonce, 0):
                    errors.append(f"rank {r} answered for another pool ({nonce!r}, #{seq})")
                elif kind != "ready":
                    errors.append(f"rank {r}: {payload[0]}")
            if errors:
                break
        if waiting and not errors:
            errors.append(f"ranks {sorted(waiting)} did not join the process group within "
                          f"{STARTUP_TIMEOUT_S:.0f} s")
        if errors:
            self.kill()
            raise PoolStartError(
                f"{START_FAILED}{self.key.backend} process group of {self.key.world_size} "
                f"rank(s) on {self.key.device}: " + "; ".join(errors), causes=tuple(errors))

    def _rank_of(self, obj: Any) -> int:
        for r in range(self.key.world_size):
            if obj is self.conns[r] or obj == self.procs[r].sentinel:
                return r
        raise KeyError(obj)

    def _tail(self, rank: int, since: int = 0) -> str:
        return ranklog.tail(self.log_path(rank), since)

    def send_request(self, kind: str, payload: Any) -> int:
        """Send request ``kind`` to every rank; returns its sequence number.

        The answers must be read (``run`` and ``health`` do) before the next request: a
        request left unanswered makes the next read find an answer for another request, and
        that discards the pool.
        """
        self.seq += 1
        raw = encode(kind, self.nonce, self.seq, payload)
        for c in self.conns:
            c.send_bytes(raw)
        return self.seq

    def read_answer(self, rank: int, seq: int, kinds: tuple[str, ...]) -> tuple[str, Any]:
        """The kind and payload of ``rank``'s answer to request ``seq``.

        EOFError/OSError when the rank is gone; :class:`ForeignAnswerError` (pool killed) when
        the answer belongs to another request or pool, or is not one of ``kinds``.
        """
        raw = self.conns[rank].recv_bytes()
        try:
            kind, nonce, got, payload = decode(raw)
        except Exception as exc:  # anything unreadable is foreign too
            self.kill()
            raise ForeignAnswerError(f"rank {rank} sent an unreadable answer to request "
                                     f"#{seq}: {exc}") from None
        if nonce != self.nonce or got != seq or kind not in kinds:
            self.kill()
            detail = f": {str(payload)[:200]}" if kind == "rejected" else ""
            raise ForeignAnswerError(
                f"rank {rank} answered {kind!r} for request #{got} of pool {nonce!r} while "
                f"request #{seq} of pool {self.nonce!r} was waiting{detail}; pool discarded")
        return kind, payload

    def run(self, inst: Instance, deadline_s: float, grace_s: float = FAIL_FAST_GRACE_S,
            on_wait: Callable[[str], None] | None = None) -> PoolRun:
        """Run ``inst`` on every rank; never blocks longer than the deadline plus a few s.

        ValueError (nothing sent) for a deadline that is not a positive finite number;
        :class:`ForeignAnswerError` when an answer belongs to another request. If anything
        goes wrong after the request was sent, the pool is killed before the exception
        leaves: its unread answers die with it.
        """
        check_deadline(deadline_s)
        check_deadline(grace_s)
        try:
            return self._run(inst, deadline_s, grace_s, on_wait)
        except BaseException:
            self.kill()
            raise

    def _run(self, inst: Instance, deadline_s: float, grace_s: float,
             on_wait: Callable[[str], None] | None = None) -> PoolRun:
        t0 = time.monotonic()
        next_note = t0 + PROGRESS_AFTER_S
        # Where this instance's output begins in each rank's log (the tail says so).
        self.log_starts = [ranklog.size(self.log_path(r)) for r in range(self.key.world_size)]
        seq = self.send_request("run", inst)
        pending = set(range(self.key.world_size))
        run = PoolRun(kind="done")
        end = t0 + deadline_s
        died: list[int] = []
        # A program through a failure kills some ranks by design (harness.casefile.deaths):
        # their deaths do not end the wait, and a rank that stalls by design is not waited for.
        planned = {r for r, _, _ in inst.deaths}
        stalls = {r for r, _, how in inst.deaths if how == "stall"}
        # After a raise, ranks provably stranded in a collective end the grace early.
        watch = (stranded.StrandWatch(inst) if stranded.eligible(inst, self.pg_timeout_s)
                 else None)
        bounded = Overdue(inst)
        while pending - stalls:
            timeout = end - time.monotonic()
            if timeout <= 0:
                break
            if bounded.active:
                late = bounded.check(time.monotonic(), {r: int(self.progress[r][1])
                                                        for r in pending - stalls})
                if late:
                    run.overdue = late
                    break
                timeout = min(timeout, POLL_S)
            if watch is not None and run.kind == "failfast" and not died:
                if watch.settled(time.monotonic(), {
                        r: res for r, res in run.results.items() if res.status == "raised"},
                        {r: int(self.progress[r][1]) for r in pending},
                        {r: self.procs[r].pid for r in pending}):
                    run.stranded = True
                    break
                timeout = min(timeout, stranded.SETTLE_S / 4)
            if on_wait is not None:
                now = time.monotonic()
                if now >= next_note:
                    on_wait(self.waiting_note(inst, pending, now - t0, end - now))
                    next_note = now + PROGRESS_EVERY_S
                timeout = min(timeout, max(next_note - now, 0.05))
            objs = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            for obj in multiprocessing.connection.wait(objs, timeout=min(timeout, WAIT_SLICE_S)):
                r = self._rank_of(obj)
                if r not in pending:
                    continue
                if obj is self.conns[r]:
                    try:
                        _, (key, result) = self.read_answer(r, seq, ("result",))
                    except (EOFError, OSError):
                        continue  # the sentinel will tell us it died
                    if key != inst.key or getattr(result, "rank", None) != r:
                        self.kill()
                        raise ForeignAnswerError(
                            f"rank {r} answered request #{seq} with the result of "
                            f"{str(key)[:200]} (rank {getattr(result, 'rank', '?')}) while "
                            f"{inst.key} was asked; pool discarded")
                    run.results[r] = result
                    pending.discard(r)
                    if result.status == "raised" and pending:
                        end = min(end, time.monotonic() + grace_s)
                        run.kind = "failfast"
                else:
                    pending.discard(r)
                    died.append(r)
                    if r not in planned:
                        end = min(end, time.monotonic() + min(grace_s, 1.0))
        run.elapsed = time.monotonic() - t0
        unplanned = set(died) - planned
        waited_for = pending - stalls  # survivors (and planned deaths) that never answered
        if unplanned:
            run.kind = "crash"
        elif waited_for and run.kind != "failfast":
            run.kind = "hang"
        elif not waited_for and run.kind == "failfast":
            run.kind = "done"  # everyone reported after all
        if not pending and not died:
            return run
        # Deaths (planned or not), stalls and hangs: say what each rank did, end the pool.
        run.states = self._diagnose(inst, pending, died, run)
        self.kill()
        return run

    def rank_step(self, inst: Instance, r: int) -> tuple[int, str]:
        """The step rank ``r`` is in (from its shared progress slot) and what it is doing."""
        step = int(self.progress[r][1])
        return step, phase(inst.steps, step)

    def waiting_note(self, inst: Instance, pending: set[int], waited: float,
                     left: float) -> str:
        """One line for a person: how long the instance has waited, which ranks have not
        answered and the step each is in, the time left before a hang is declared."""
        where = []
        for r in sorted(pending):
            step, desc = self.rank_step(inst, r)
            where.append(f"rank {r} in step {step} ({desc})" if step >= 0 else
                         f"rank {r} {desc}")
        done = self.key.world_size - len(pending)
        return (f"waiting {waited:.0f} s: {'; '.join(where)}"
                + (f"; {done} rank(s) answered" if done else "")
                + f"; {left:.0f} s left before the deadline declares a hang")

    def _diagnose(self, inst: Instance, pending: set[int], died: list[int],
                  run: PoolRun) -> list[RankState]:
        sizes = {r: ranklog.size(self.stack_path(r)) for r in pending}
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
            step, desc = self.rank_step(inst, r)
            if r in died:
                proc = self.procs[r]
                proc.join(1.0)
                code = proc.exitcode
                sig = signal.Signals(-code).name if code is not None and code < 0 else ""
                states.append(RankState(r, "died", step=step, step_desc=desc, exitcode=code,
                                        signal=sig,
                                        stderr_tail=self._tail(r, self.log_starts[r])))
            else:
                # What the backend's own threads printed (an exception in a callback) is
                # often the only account of why the rank never returned.
                states.append(RankState(r, "blocked", step=step, step_desc=desc,
                                        stack=ranklog.clean_stack(stacks.get(r, "")),
                                        flight_recorder=recorder.get(r, []),
                                        stderr_tail=self._tail(r, self.log_starts[r])))
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

    def health(self, timeout_s: float = HEALTH_DEADLINE_S) -> str:
        """Check that the group is in step; "" when it is, else why not (pool killed then).

        Every rank runs a barrier and a sequence-tagged all_gather (see
        :func:`harness.run.rank.health_answer`) and answers, bound to this request, within
        ``timeout_s``.
        """
        if not self.alive:
            return "the pool was stopped"
        try:
            seq = self.send_request("health", None)
        except OSError as exc:
            self.kill()
            return f"could not reach the ranks: {exc}"
        end = time.monotonic() + timeout_s
        pending = set(range(self.key.world_size))
        problems: list[str] = []
        while pending and time.monotonic() < end:
            objs = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            for obj in multiprocessing.connection.wait(objs, timeout=max(0.0, end -
                                                                         time.monotonic())):
                r = self._rank_of(obj)
                if r not in pending:
                    continue
                pending.discard(r)
                if obj is not self.conns[r]:
                    problems.append(f"rank {r} died")
                    continue
                try:
                    kind, detail = self.read_answer(r, seq, ("healthy", "unhealthy"))
                except (EOFError, OSError):
                    problems.append(f"rank {r} died")
                    continue
                except ForeignAnswerError as exc:
                    return str(exc)
                if kind != "healthy":
                    problems.append(f"rank {r}: {detail}")
            if problems:
                break
        if pending and not problems:
            problems.append(f"rank(s) {sorted(pending)} did not answer within {timeout_s:g} s")
        if problems:
            self.kill()
            return "; ".join(problems)
        return ""

    def kill(self) -> None:
        """Kill every rank now and remove the pool's files; safe to call from several
        threads at once (a second caller waits until the first is done) and again later."""
        with self._kill_lock:
            self.alive = False
            if self._killed:
                return
            self._killed = True
            for p in self.procs:
                if p.pid is not None:
                    keeper.kill_group(p.pid)  # the rank and whatever it started
            for p in self.procs:
                if p.pid is not None:  # not one listed but never started
                    p.join(2.0)
            for c in (*self.conns, *self.fr_requests):
                c.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            _live_pools.discard(self)

    def close(self) -> None:
        """Stop the ranks politely (destroy the process group), then make sure they are gone."""
        if self.alive:
            with contextlib.suppress(OSError):
                self.send_request("stop", None)
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


def _read_grown(pool: RankPool, sizes: dict[int, int], end: float) -> dict[int, str]:
    """Wait until each signalled rank's stack dump has been written, then read it."""
    out: dict[int, str] = {}
    last: dict[int, int] = {}
    while time.monotonic() < end:
        done = True
        for r, start in sizes.items():
            now = ranklog.size(pool.stack_path(r))
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


# How a run that did not end with every rank's answer left its pool, in a record's words.
ENDED = {"failfast": "a rank raised while others were still in the call, and they were "
                     "ended",
         "hang": "ranks did not answer by the deadline and were ended",
         "crash": "a rank died"}


def reuse_blockers(inst: Instance, run: PoolRun) -> list[str]:
    """Why a pool cannot be kept after ``run``, whatever a health check says (empty: the
    health check decides).

    The health check proves the default group's collectives are in step. It cannot see a
    point-to-point message a rank left unreceived when it raised (matched by tag, a later
    instance's recv could read it), a subgroup left out of step, or async work a raising
    rank never waited for; each of these replaces the pool.
    """
    why: list[str] = []
    if run.kind != "done":
        why.append(ENDED.get(run.kind, f"the instance ended with a {run.kind}"))
    raised = [r for r in run.results.values() if r.status == "raised"]
    if not raised:
        return why
    left = sorted(r.rank for r in raised if r.in_flight)
    if left:
        why.append(f"rank(s) {left} raised with async work in flight")
    for step in flat_steps(inst.steps):
        if step.kind != "op" or step.op is None:
            continue
        if step.op in ops.ALL_OPS and ops.get(step.op).point_to_point:
            why.append(f"a rank raised in a program with point-to-point traffic ({step.op})")
            break
        if dict(step.args).get("group") is not None:
            why.append(f"a rank raised in a program that uses a subgroup ({step.op})")
            break
    return why


class PoolManager:
    """Hands out pools by key, reusing them; keeps at most ``max_pools`` alive (LRU)."""

    def __init__(self, max_pools: int = 2, pg_timeout_s: float = 600.0) -> None:
        self.max_pools = max_pools
        self.pg_timeout_s = pg_timeout_s
        self.pools: OrderedDict[PoolKey, RankPool] = OrderedDict()
        self.started = 0
        self.replaced = 0  # pools replaced after an instance (see settle)
        self._isolated = 0
        self._count_lock = threading.Lock()

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
        """A private pool for one instance; the caller closes it. Safe to call from several
        threads at once (isolated instances run ahead: harness.plugin.ahead)."""
        with self._count_lock:
            self._isolated += 1
            self.started += 1
            number = self._isolated
        return RankPool(PoolKey(key.backend, key.device, key.world_size, key.backend_modules,
                                number, key.env, key.pg_timeout_s, key.bind_device),
                        self.pg_timeout_s)

    def settle(self, pool: RankPool, inst: Instance, run: PoolRun) -> str:
        """Keep ``pool`` for the next instance or replace it; returns why it was replaced
        ("" when kept).

        A pool whose run ended in a hang or crash is gone already. After an instance in which
        a rank raised or a value came out wrong, the pool is kept only if nothing in
        :func:`reuse_blockers` applies and the health check passes; a raise is the common
        case (a rejected call), and a new pool per rejection would cost a rendezvous, or a new
        communicator on NCCL, each time. The pool protocol's request numbers guarantee that
        whatever a kept pool still holds can never be read as a later instance's answer.
        """
        if pool.key.isolated:
            # Killed, not stopped politely: its ranks never serve again, and the polite stop
            # (destroy the process group, wait for the exits) cost each isolated instance
            # about 20 ms; whatever a rank started dies with its process group all the same.
            pool.kill()
            return ("an isolated pool is closed after its instance"
                    if run.kind != "done" or _raised(run) else "")
        why = "; ".join(reuse_blockers(inst, run))
        if not why and (_raised(run) or any(not c.ok for r in run.results.values()
                                            for c in r.checks)):
            why = pool.health()
            why = f"health check failed: {why}" if why else ""
        if why or not pool.alive:
            self.discard(pool.key)
            self.replaced += 1
            return why or "the pool was stopped"
        return ""

    def discard(self, key: PoolKey) -> None:
        pool = self.pools.pop(key, None)
        if pool is not None:
            pool.kill()

    def close(self) -> None:
        """Close every pool; one that fails to close does not keep the others running (its
        ranks are killed, and the first failure is raised after all were tried)."""
        failed: BaseException | None = None
        while self.pools:
            _, pool = self.pools.popitem()
            try:
                pool.close()
            except Exception as exc:
                failed = failed or exc
                with contextlib.suppress(Exception):
                    pool.kill()
        if failed is not None:
            raise failed


def _raised(run: PoolRun) -> bool:
    return any(r.status == "raised" for r in run.results.values())


_live_pools: set[RankPool] = set()


@atexit.register
def kill_leftovers() -> None:
    """Kill the ranks of every pool still alive in this process (the last resort of a
    session whose orderly close failed, and of interpreter exit)."""
    for pool in list(_live_pools):
        with contextlib.suppress(Exception):
            pool.kill()
