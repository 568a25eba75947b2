"""Stage 3, execution: where instances run and what happened to the ranks.

Parent side: ``capabilities`` (what this machine and torch can run: skips decided without
starting a rank) and ``pool`` (persistent rank pools per backend/device/world size, deadlines,
hang and crash diagnosis, cleanup). Rank side: ``rank`` (the rank process: join the group once,
then run instances through :mod:`harness.program` until told to stop). ``external`` runs the
same per-rank code under torchrun/srun, with rank 0 writing the report.

Gives a :class:`~harness.model.PoolRun` (per-rank results, or the states of ranks that hung
or died). Must not: judge results (that is :mod:`harness.verdict`), or leave a process behind.
"""
