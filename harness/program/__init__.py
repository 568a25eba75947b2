"""Stage 3, rank side: the step interpreter that runs one instance inside a rank.

Takes an :class:`~harness.model.Instance` and an initialized default process group; gives a
:class:`~harness.model.RankResult` (status, per-buffer checks, timeline, ordering facts).
``interpreter`` builds buffers, executes steps and checks results (its public functions are
what the ordering probes reuse); ``timeline`` runs waits, streams and ordering steps and
records what happened when; ``groups`` runs ``new_group`` steps (torch's group constructors)
and checks what they returned; ``tensors`` and ``objects`` make, poison, compare and digest
values.

Must not: decide outcomes (it reports facts; :mod:`harness.verdict` judges), talk to the
parent (that is :mod:`harness.run`), or be imported by the pytest process at collection
(it imports torch).
"""
