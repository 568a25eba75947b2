"""The async contract (``async_op=True``, ``wait()``, ``synchronize``): plan, probe, judge.

Takes expanded instances and gives them an ordering plan (``plan``, parent, at collection and
setup); inside the ranks, ``probes`` re-runs a sampled async instance with injected delays
through the step interpreter's public API (:mod:`harness.program.interpreter`) and returns raw
observations; back in the parent, ``verdicts`` turns the observations of every rank into
ok / violated / inconclusive / n/a per check.

Must not: judge inside a rank (probes only observe), or import torch in ``plan`` and
``verdicts`` (they run in the pytest process).
"""
