"""Stage 6, the CI gate: a report and a baseline in, a verdict and an exit status out.

``baseline`` reads and writes baseline files (one entry per instance, a policy, a person's
``allow``/``note`` kept across refreshes); ``compare`` classifies every instance (regression,
new failure, missing, fixed, ...) and renders the result; ``cli`` is the ``collective-gate``
command; ``versions`` compares two reports of different torch versions (the
``collective-versions`` command and its "What changed between torch versions" page). Works on
report JSON only.

Must not: import torch or run anything; be more positive than the report it reads.
"""
