"""Stage 4, the runner: one path from an instance to its verdict, for every front end.

Takes an :class:`~harness.model.Instance` from collection and the session's
:class:`~harness.runner.settings.RunSettings`. ``prepare`` makes it the instance that runs
here (overrides for this torch and NCCL, the ordering and perf plans, ``--check-iters``, the
capability skip, the deadline); ``execute`` runs it on the rank pool its key names (one retry
on a fresh pool after an answer that belongs to another request), judges it, adds the perf
aggregate, settles the pool and times the phases. Two breakers stop what would cost every
instance the same: ``starts`` (always on) a pool family that failed to start three times in a
row, ``breaker`` (``--after-hang skip``) an op or capability that hung in two cases. The
pytest items, the fuzzer, external mode and the benchmarks all call it, so the rules cannot
drift apart.

Gives an :class:`~harness.model.InstanceResult` (and the :class:`~harness.model.PoolRun` it
was judged from). Must not: import pytest, build a report, or keep a pool whose state is
unknown (after an internal error the pool is discarded).
"""
