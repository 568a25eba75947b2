"""collective-harness: a declarative conformance harness for torch.distributed collectives.

The tree is the pipeline (docs/explanation/architecture.md; data flows one way, down this list):

- ``model``, ``errors``, ``expr``, ``dtypes``: the records and vocabulary every stage shares;
  they import nothing above them;
- ``casefile/``: YAML case files -> validated cases -> instances (collection, no torch);
- ``ops/``: the op table, one entry per op (call, reference, bus factor, arguments);
- ``ordering/``: the async-contract checks: plan (parent), probes (rank), verdicts (parent);
- ``program/``: the rank-side step interpreter (buffers, steps, checks);
- ``run/``: rank pools and capability checks (parent), the rank process, external ranks;
- ``verdict/``: what the ranks did -> outcome and message (the instance, per-step checks);
- ``report/``: JSON, Markdown, HTML, step summary writers;
- ``gate/``: baselines, comparison, the ``collective-gate`` command;
- ``plugin``: the pytest integration;
- beside the pipeline: ``perf/`` (bandwidth mode), ``bench/`` (``collective-bench``),
  ``mutate/`` (``collective-mutate``), ``backends/`` (the wrapping-backend base).

Nothing imported at package import time touches torch; only code that runs inside rank
processes does.
"""

__version__ = "0.1.0"
