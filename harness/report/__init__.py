"""Stage 5, reports: instance records in, files for people and machines out.

``records`` builds and validates the JSON report (schema shipped in ``harness/schemas``) and
writes files atomically; ``markdown``, ``html``, ``step_summary``, ``ordering_table`` and
``oneline`` render it; ``junitfile`` adds a session verdict to pytest's JUnit XML. Works on
records (plain dicts) only.

Must not: import torch, run anything, or say more than the records say.
"""
