"""Loaded by every Python process of a guarded run (this folder is put first on PYTHONPATH).

It installs the guard only where ``COLLECTIVE_GUARD_DIR`` is set, so a process that inherits
PYTHONPATH without it is untouched; torch is imported only then. A drill (``--inject``) also
swaps the job's Gloo groups for the mutant backend, wrapped by the guard.
"""

import os

if os.environ.get("COLLECTIVE_GUARD_DIR"):
    from harness.guard import rank

    rank.install(os.environ["COLLECTIVE_GUARD_DIR"])
    _g = rank.guard()
    if _g is not None and _g.s.inject:
        from harness.guard import pyhook

        pyhook.inject(_g, _g.s.inject)
