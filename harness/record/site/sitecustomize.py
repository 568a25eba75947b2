"""Loaded by every Python process of a recorded run (this folder is put first on PYTHONPATH).

It installs the recorder only where ``COLLECTIVE_RECORD_DIR`` is set, so a process that
inherits PYTHONPATH without it is untouched; torch is imported only then.
"""

import os

if os.environ.get("COLLECTIVE_RECORD_DIR"):
    from harness.record import hook

    hook.install(os.environ["COLLECTIVE_RECORD_DIR"])
