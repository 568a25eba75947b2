"""collective-harness: a declarative conformance harness for torch.distributed collectives.

The tree is the pipeline (docs/explanation/architecture.md; data flows one way, down this list):

- ``model``, ``errors``, ``expr``, ``dtypes``: the records and vocabulary every stage shares;
  they import nothing above them;
- ``casefile/``: YAML case files -> validated cases -> instances (collection, no torch);
- ``ops/``: the op table, one entry per op (call, reference, bus factor, arguments);
- ``ordering/``: the async-contract checks: plan (parent), probes (rank), verdicts (parent);
- ``perf/``: performance mode: which instances are timed, and the statistics (parent);
- ``program/``: the rank-side step interpreter (buffers, steps, checks);
- ``run/``: pools and ranks only: capabilities, pool, rank process; must not judge;
- ``verdict/``: what the ranks did -> outcome and message (the instance, per-step checks);
- ``manifest/``: a backend's capability manifest (what it claims, what it wraps), read and
  applied per instance by the runner (needs, declared gaps, inherited overrides);
- ``runner/``: one path to a verdict: prepare an instance (overrides for this torch/NCCL,
  ordering and perf plans, ``--check-iters``, capability skip) and run and judge it (the pool
  by its key, one retry after a foreign answer, the verdict, the perf aggregate, pool settle,
  phase timings); every front end (pytest items, the fuzzer, external mode, the benchmarks)
  calls it;
- ``report/``: JSON, Markdown, HTML, step summary writers;
- ``gate/``: baselines, comparison, the ``collective-gate``, ``collective-versions`` and
  ``collective-diff`` commands;
- ``plugin/``: the pytest integration;
- ``external/``: external-ranks mode (torchrun/srun/mpirun): ``python -m harness.external``;
  schedule (packing instances onto rank blocks), progress (resume after a hang or crash),
  launch (launcher environment, watchdog); a front end over the runner's prepare and verdict;
- beside the pipeline: ``bench/`` (``collective-bench``), ``backends/`` (the wrapping-backend
  base), ``mutate/`` (``collective-mutate``), ``fuzz/`` (``collective-fuzz``: generated
  instances, shrunk findings as case files), ``record/`` (``collective-record``: a real run's
  collectives as case files), ``guard/`` (``collective-guard``: a sample of a real run's
  collectives checked from digests, mismatches as case files), ``certify/``
  (``collective-certify``: identity probes, the library against a manifest, cells and a
  level) and ``docsgen/`` (the docs pages rendered from code and data; imported by no stage).

Nothing imported at package import time touches torch; only code that runs inside rank
processes does.
"""

import sys

__version__ = "0.1.0"


def _leave_unrewritten() -> None:
    """Take the harness out of pytest's assertion rewriting.

    pytest marks every package of a distribution that declares a ``pytest11`` entry point for
    rewriting, and its import hook then parses and compiles each such module from source in
    every session that cannot cache the result (``PYTHONDONTWRITEBYTECODE``, a read-only
    site-packages): measured at about 0.3 s of each session's start, before the forkserver
    could start, and again in every child session of the tests. The harness's own asserts
    need no rewritten messages. pytest has no public way to take a mark back: its hook's two
    attributes are looked up with care, and a pytest without them is left as it is
    (``tests/test_session_cost.py`` says when that happens).
    """
    for finder in sys.meta_path:
        if type(finder).__name__ != "AssertionRewritingHook":
            continue
        marked = getattr(finder, "_must_rewrite", None)
        cache = getattr(finder, "_marked_for_rewrite_cache", None)
        if not isinstance(marked, set) or not isinstance(cache, dict):
            continue
        ours = {n for n in (*marked, *cache) if n == __name__ or n.startswith(__name__ + ".")}
        marked.difference_update(ours)
        for name in ours:
            cache.pop(name, None)


_leave_unrewritten()
