"""Run a prepared instance on its rank pool and judge it: the one way every front end does it.

The steps, in order: the pool by the instance's key (a private one for an isolated instance),
the run, the verdict (:func:`harness.verdict.outcome.judge`), the perf aggregate of a passed
instance in a ``--perf`` session, the pool's settling (kept, health-checked or replaced) and
the phase timings. An answer that belongs to another request has already discarded its pool
(:class:`~harness.run.pool.ForeignAnswerError`): the instance runs once more on a fresh pool
and is an ``error`` if that happens again. A failure of the harness itself becomes an
``error`` result that says so, and the pool it happened on is discarded, never reused.

Ranks are shared by the instances of a pool, and so is any state a backend keeps between them:
a wrapper that swallows one error and stays broken turns every later instance's values wrong.
A ``failed`` instance that ran on ranks where an earlier instance failed or raised is therefore
run once more on fresh ranks (the suspect pool is discarded), at most ``fresh_reruns`` times a
session; its outcome stays ``failed`` whatever the rerun does, and its record's
``fresh_rerun`` and its message say whether it passes there (state carried between instances).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..model import BAD_OUTCOMES, Instance, InstanceResult, PoolRun
from ..perf import plan as perfplan
from ..perf import stats as perfstats
from ..report import costs
from ..run.capabilities import Capabilities, probe
from ..run.pool import ForeignAnswerError, PoolKey, PoolManager, PoolStartError, RankPool
from ..verdict.outcome import judge
from .breaker import Breaker
from .prepare import Prepared, pool_key, prepare
from .settings import RunSettings
from .starts import StartBreaker

# A rerun's outcomes that count as "passes on fresh ranks": the contract held there (a pass,
# or a pass against what an override declares).
MET = frozenset({"passed", "limitation"})


class Cancelled(RuntimeError):
    """A launch that its caller called off before the run began."""


@dataclass
class Launched:
    """An instance's run on a pool, not judged yet (a run ahead of its turn hands one over)."""

    pool: RankPool
    run: PoolRun
    pool_s: float  # getting the pool
    run_s: float  # the run


@dataclass
class Judged:
    """What :meth:`Runner.execute` gives: the result and the run it was judged from (None when
    nothing ran: the pool did not start, the deadline was unusable, the harness failed)."""

    result: InstanceResult
    run: PoolRun | None = None


class Runner:
    """Prepares, runs and judges instances for one session; owns the session's pools."""

    def __init__(self, settings: RunSettings, max_pools: int = 2,
                 caps: Capabilities | None = None) -> None:
        self.settings = settings
        self.max_pools = max_pools
        self._caps = caps
        self._manager: PoolManager | None = None
        self.breaker = Breaker() if settings.after_hang == "skip" else None
        self.starts = StartBreaker()  # always on: see harness.runner.starts
        self.fresh_reruns_used = 0  # of settings.fresh_reruns (see _on_fresh_ranks)
        # Case id -> an instance of it that failed on fresh ranks too: the case's other
        # instances spend no rerun (a genuine failure of a case is seldom one instance's).
        self.fails_on_fresh_ranks: dict[str, str] = {}

    @property
    def caps(self) -> Capabilities:
        """What torch and this machine offer (read once, on first use; ProbeError if torch or
        a backend module cannot be loaded)."""
        if self._caps is None:
            self._caps = probe(self.settings.backend_modules)
        return self._caps

    @property
    def manager(self) -> PoolManager:
        """The session's rank pools (started on first use)."""
        if self._manager is None:
            self._manager = PoolManager(max_pools=self.max_pools,
                                        pg_timeout_s=self.settings.pg_timeout_s)
        return self._manager

    @property
    def has_pools(self) -> bool:
        """Whether any pool was asked for (a session whose instances all skip starts none)."""
        return self._manager is not None

    def prepare(self, inst: Instance, local_rank: int | None = None,
                settings: RunSettings | None = None) -> Prepared:
        """``inst`` as it runs here (:func:`harness.runner.prepare.prepare`); ``settings``:
        other settings for this one instance (the fuzzer probes a sample of its documents)."""
        prepared = prepare(inst, settings or self.settings, self.caps, local_rank)
        inst = prepared.instance
        # An isolated instance may have run ahead of its turn, its failed start among those
        # that tripped the start breaker: its record is that error, not a skip.
        blocked = (self.starts.blocked(self.key(inst), inst.key if inst.isolate else "")
                   or self.hung_need(inst))
        if blocked and not prepared.skip:
            prepared = replace(prepared, skip=blocked)
        return prepared

    def hung_need(self, inst: Instance) -> str:
        """Why ``inst`` is skipped as blocked because what it needs hung before
        (``--after-hang skip``, :mod:`harness.runner.breaker`), "" while it runs. The breaker
        never resets, so an instance blocked now is skipped when its item is reached: a run
        ahead of its turn asks this before it starts a pool (:mod:`harness.plugin.ahead`)."""
        return self.breaker.blocked(inst) if self.breaker else ""

    def news(self) -> list[str]:
        """What the breakers stopped since the last call, one line each, said once (the front
        end prints them after ``collective-harness: ``)."""
        return self.starts.news() + (self.breaker.news() if self.breaker else [])

    def key(self, inst: Instance) -> PoolKey:
        """The pool ``inst`` runs on."""
        return pool_key(inst, self.settings)

    def launch(self, prepared: Prepared, on_wait: Callable[[str], None] | None = None,
               started: Callable[[RankPool], bool] | None = None) -> Launched:
        """Run ``prepared`` on its pool without judging it. Raises PoolStartError when the
        pool cannot start and ForeignAnswerError when its answer belongs to another request
        (the pool is gone then). ``started`` is told the pool before the run; if it answers
        False (its caller is closing), the run does not happen (Cancelled). Every start, and
        every start refused once the start breaker tripped, is told to it here."""
        inst = prepared.instance
        t0 = time.monotonic()
        key = self.key(inst)
        refused = self.starts.blocked(key)
        if refused:
            raise PoolStartError(f"not started: {refused}")
        try:
            pool = self.manager.isolated(key) if inst.isolate else self.manager.get(key)
        except PoolStartError as exc:
            self.starts.failed(key, exc, inst.key)
            raise
        self.starts.started(key)
        t1 = time.monotonic()
        try:
            if started is not None and not started(pool):
                raise Cancelled(f"{inst.where()}: not run: its caller is closing")
            run = pool.run(inst, prepared.deadline_s, on_wait=on_wait)
        except BaseException:
            if inst.isolate:  # a private pool: nobody else would stop it
                pool.kill()
            raise
        return Launched(pool, run, pool_s=t1 - t0, run_s=time.monotonic() - t1)

    def verdict(self, inst: Instance, run: PoolRun, deadline_s: float) -> InstanceResult:
        """The result of ``run``: the verdict, and the timings of a passed instance in a
        ``--perf`` session (a bandwidth never hides a failure). External mode calls this on
        runs it gathered itself."""
        result = judge(inst, run, deadline_s)
        if result.outcome == "passed" and self.settings.perf.enabled:
            result.perf = (perfstats.aggregate(inst, run.results) if inst.perf
                           else {"not_timed": perfplan.not_timed(inst)})
        return result

    def execute(self, prepared: Prepared, on_wait: Callable[[str], None] | None = None,
                first: Launched | PoolStartError | None = None) -> Judged:
        """Run and judge ``prepared`` (``first``: its run made ahead of its turn, or why that
        run's pool did not start). Never raises for a failure of the harness: that is an
        ``error`` result, and the pool it happened on is discarded."""
        inst = prepared.instance
        t0 = time.monotonic()
        held: list[RankPool] = []
        try:
            judged = self._execute(prepared, on_wait, first, held)
        except Exception as exc:  # a bug of the harness, not a verdict on the backend
            self._drop(inst, held)
            judged = Judged(internal_error(inst, exc, "running or judging"))
        judged.result.overrides_not_applied = list(prepared.not_applied)
        judged.result.duration = time.monotonic() - t0
        if self.breaker is not None:
            self.breaker.observe(inst, judged.result)
        return judged

    def _execute(self, prepared: Prepared, on_wait: Callable[[str], None] | None,
                 first: Launched | PoolStartError | None, held: list[RankPool]) -> Judged:
        inst = prepared.instance
        where = inst.where()
        if prepared.problem:
            return Judged(InstanceResult("error", f"{where}: {prepared.problem}",
                                         expected_kind=inst.expectation.kind))
        foreign = ""
        for _attempt in range(2):
            try:
                if isinstance(first, PoolStartError):
                    raise first
                launched, ahead = (first, True) if first is not None else (
                    self.launch(prepared, on_wait), False)
                first = None
            except PoolStartError as exc:
                return Judged(InstanceResult("error", f"{where}: {exc}",
                                             expected_kind=inst.expectation.kind))
            except ForeignAnswerError as exc:
                if foreign:
                    return Judged(InstanceResult(
                        "error", f"{where}: harness error: two pools in a row answered with "
                        f"messages that do not belong to this instance, so nothing was judged."
                        f"\n  first: {foreign}\n  then: {exc}",
                        expected_kind=inst.expectation.kind, pool_replaced=True,
                        pool_replaced_why="two pools in a row answered for another instance"))
                foreign = str(exc)
                continue
            held.append(launched.pool)
            t_judge = time.monotonic()
            result = self.verdict(inst, launched.run, prepared.deadline_s)
            result.ran_ahead = ahead
            t_settle = time.monotonic()
            earlier = launched.pool.first_bad
            result.pool_replaced_why = self._settle(launched, inst, result)
            result.pool_replaced = bool(result.pool_replaced_why)
            held.clear()  # settled: kept in a known state, or gone
            result.phases = costs.phases(launched.run, pool_s=launched.pool_s,
                                         run_s=launched.run_s, judge_s=t_settle - t_judge,
                                         settle_s=time.monotonic() - t_settle)
            if result.outcome == "failed" and earlier and not ahead:
                self._on_fresh_ranks(prepared, on_wait, launched.pool, earlier, result, held)
            if foreign:
                result.pool_replaced = True
                result.pool_replaced_why = (result.pool_replaced_why
                                            or "the first pool answered for another instance")
                result.message += ("\n  (run on a fresh pool: the first pool's answer did not "
                                   f"belong to this instance and was discarded: {foreign})")
            return Judged(result, launched.run)
        raise AssertionError("unreachable")

    def _settle(self, launched: Launched, inst: Instance, result: InstanceResult) -> str:
        """Keep or replace the pool (PoolManager.settle); why it was replaced ("" if kept). A
        kept pool remembers the first instance that failed or in which a rank raised on it."""
        pool, run = launched.pool, launched.run
        replaced = self.manager.settle(pool, inst, run)
        if not replaced and not pool.first_bad and (
                result.outcome in BAD_OUTCOMES
                or any(r.status == "raised" for r in run.results.values())):
            pool.first_bad = inst.key
        return replaced

    def _on_fresh_ranks(self, prepared: Prepared, on_wait: Callable[[str], None] | None,
                        pool: RankPool, earlier: str, result: InstanceResult,
                        held: list[RankPool]) -> None:
        """Run a failure again on fresh ranks, when ``earlier`` failed or raised on the same
        ones before it: state a backend carries from one instance to the next (an error that
        leaves it broken) shows as later instances' wrong values. The outcome stays a failure
        whatever the rerun does; the record and the message say what it did. At most
        ``fresh_reruns`` per session, none for a case another instance of which failed on
        fresh ranks too."""
        inst = prepared.instance
        fails_anyway = self.fails_on_fresh_ranks.get(inst.case_id)
        if fails_anyway:  # a rerun would most likely be spent on it for nothing
            result.message += (f"\n  (failed after {earlier} failed or raised on the same "
                               f"ranks; not run again on fresh ranks: {fails_anyway}, of the "
                               "same case, failed there too)")
            return
        if self.fresh_reruns_used >= self.settings.fresh_reruns:
            result.message += (f"\n  (failed after {earlier} failed or raised on the same "
                               f"ranks; not run again on fresh ranks: the session's "
                               f"{self.settings.fresh_reruns} rerun(s) (--fresh-reruns) "
                               "are spent)")
            return
        self.fresh_reruns_used += 1
        if pool.alive and not pool.key.isolated:  # suspect: never reused, even if healthy
            self.manager.discard(pool.key)
            self.manager.replaced += 1
            result.pool_replaced = True
            # the earlier instance is named in fresh_rerun: this line groups on a certificate
            result.pool_replaced_why = ("not reused: this instance failed after an earlier one "
                                        "failed or raised on the same ranks")
        try:
            launched = self.launch(prepared, on_wait)
        except (PoolStartError, ForeignAnswerError) as exc:
            result.fresh_rerun = {"after": earlier, "fresh": "error", "state_carried": False}
            result.message += (f"\n  (failed after {earlier} failed or raised on the same "
                               f"ranks; could not run it again on fresh ranks: {exc})")
            return
        held.append(launched.pool)
        again = self.verdict(inst, launched.run, prepared.deadline_s)
        self._settle(launched, inst, again)
        held.clear()
        carried = again.outcome in MET
        result.fresh_rerun = {"after": earlier, "fresh": again.outcome, "state_carried": carried}
        if carried:
            result.message += (f"\n  failed only after {earlier} on the same ranks; passes "
                               "on fresh ranks: state carried between instances")
        else:
            self.fails_on_fresh_ranks[inst.case_id] = inst.key
            result.message += (f"\n  (run again on fresh ranks, since {earlier} failed or "
                               f"raised on the same ranks before it: {again.outcome} there "
                               "too)")

    def _drop(self, inst: Instance, held: list[RankPool]) -> None:
        """After an internal error the pool's state is unknown: never reuse it. The pool in
        hand is the one discarded (its key is the one it was made with); before one was in
        hand, the instance's own pool, by the same key that would have fetched it."""
        # The record already says what went wrong; a failing discard adds nothing.
        with contextlib.suppress(Exception):
            for pool in held:
                if pool.key.isolated:
                    pool.kill()
                else:
                    self.manager.discard(pool.key)
            if not held and not inst.isolate and self._manager is not None:
                self._manager.discard(self.key(inst))

    def close(self) -> None:
        """Stop every rank this runner started (raises what went wrong, after trying all)."""
        if self._manager is not None:
            manager, self._manager = self._manager, None
            manager.close()


def internal_error(inst: Instance, exc: BaseException, stage: str) -> InstanceResult:
    """The ``error`` result of an instance on which the harness itself failed: it says so, and
    keeps the traceback, rather than dropping the instance from the report."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = f"{type(exc).__name__}: {exc}"[:2000]
    message = (f"{inst.where()}: internal error in collective-harness while {stage} this "
               f"instance; this is a bug in the harness, not a verdict on the backend (please "
               f"report it):\n  {text}\n{tb.rstrip()}")
    return InstanceResult("error", message, expected_kind=inst.expectation.kind,
                          harness_error={"type": type(exc).__name__, "message": str(exc),
                                         "traceback": tb, "stage": stage})
