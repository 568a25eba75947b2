"""Stage 3, execution: where instances run and what happened to the ranks; pools and ranks only.

Parent side: ``capabilities`` (what this machine and torch can run: skips decided without
starting a rank), ``pool`` (persistent rank pools per key, deadlines, hang and crash diagnosis,
cleanup), ``stranded`` (ending a fail-fast grace early), ``torchfacts`` (reading torch's facts
in a forked process). Rank side: ``rank`` (the rank process: join the group once, then run
instances through :mod:`harness.program` until told to stop). Preparing, running and judging an
instance is :mod:`harness.runner`'s; external-ranks mode is :mod:`harness.external`.

Gives a :class:`~harness.model.PoolRun` (per-rank results, or the states of ranks that hung
or died). Must not: judge results (that is :mod:`harness.verdict`, through the runner), or
leave a process behind.
"""
