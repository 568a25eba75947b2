"""Verdict: what every rank did -> one outcome and a message for a person.

Takes: an instance (its expectation resolved) and the :class:`~harness.model.PoolRun` the ranks
produced (per-rank status, checks, exceptions, events). :mod:`~harness.verdict.outcome` judges
the whole instance (values, raises, hangs, crashes, rank agreement, the ordering checks
through :mod:`harness.ordering.verdicts`); :mod:`~harness.verdict.steps` judges the
expectations a program attached to single steps (a step's ``raises:``, ``blocks_until_all``).

Gives: an :class:`~harness.model.InstanceResult` (outcome, message, per-rank detail) for the
report stage.

Must not: run anything on a backend, read files, or say more than the ranks observed: an
outcome is derived from every rank, and a rank that gave no answer is never counted as passed.
"""
