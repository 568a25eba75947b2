"""Benchmarks of the harness itself: ``collective-bench``.

Takes: world sizes, instance counts and options from the command line. It runs instances
through the same rank pools and verdict as pytest does (:mod:`~harness.bench.overhead`: the
per-test overhead against spawn-per-test and a bare loop, hang reporting, the cost of a
rejected call) and, with ``--busbw``, the perf mode against a bare ``torch.distributed`` loop
(:mod:`~harness.bench.busbw`).

Gives: tables on the terminal and JSON (``--json``) with the figures the docs state.

Must not: be a test (speed targets are checked by running it, never by timed tests), or change
anything a conformance run records.
"""
