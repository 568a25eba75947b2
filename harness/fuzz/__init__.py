"""Fuzzing: generated instances from the op table, run and judged like case instances.

``collective-fuzz`` draws case documents with Hypothesis (:mod:`~harness.fuzz.space`), runs
each through the case-file loader, the rank pools and the verdict in process
(:mod:`~harness.fuzz.execute`), skips what the case library's overrides already know
(:mod:`~harness.fuzz.known`), lets Hypothesis shrink a failure to a minimal instance
(:mod:`~harness.fuzz.engine`) and writes it as a case file (:mod:`~harness.fuzz.findings`);
:mod:`~harness.fuzz.differential` compares outputs bit for bit with another backend or run.
``--lanes N`` runs N such fuzzers as worker processes (:mod:`~harness.fuzz.worker`) that
:mod:`~harness.fuzz.lanes` coordinates over checked JSON messages (:mod:`~harness.fuzz.wire`).

Takes: a backend, a budget, a seed, the op table and the case library. Gives: case files of
findings, a summary, optionally a digests report. Must not: hand-write a shrinker, judge an
instance in any other way than the plugin does, or leave a rank or worker process behind.
"""
