"""collective-guard: check a sample of a real run's own collectives while it trains.

Runs a launch command (``python train.py``, ``torchrun ...``) with a checker injected into every
Python process it starts (``site/sitecustomize.py`` on ``PYTHONPATH``, active only where
``COLLECTIVE_GUARD_DIR`` names a folder). For one call in N per op family and group, each rank
digests what it contributed and what it received (:mod:`harness.guard.digest`, torch ops on the
tensor's device), publishes the digests on the job's own c10d store (the side channel: not the
backend under test), and a checker thread decides the call from every rank's digests
(:mod:`harness.guard.check`). A mismatch is localised (call, group, sequence number, site, rank,
chunk, sender) and written at once as a finding; the parent turns the findings into case files
that ``pytest findings/`` replays (:mod:`harness.guard.findings`). Must not: change what the run
computes, fail the job because the guard itself failed, or unpickle anything.
"""
