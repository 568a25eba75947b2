"""Imported by the forkserver only: it ends at once when its session does.

Why: the forkserver imports torch, and an interpreter with torch loaded takes about 0.3 s to
shut down (module teardown), during which it still holds the session's stdout and stderr.
Whoever reads pytest's output through a pipe (CI logs through ``tee``, ``subprocess.run``
with ``capture_output``, this project's own tests) waits for that end of file: 0.3 s of every
session, about a tenth of a small one. The forkserver has nothing to flush or clean up when
its parent is gone (its children are the ranks, which end on their own), so it leaves with
``os._exit`` once its own exit begins. Ranks are forked from it and inherit the registration;
the process id check keeps it the forkserver's alone, so a child's exit status is its own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

_FORKSERVER_PID = os.getpid()


def _leave() -> None:
    if os.getpid() != _FORKSERVER_PID:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


# atexit runs the last registered first: the handlers of modules preloaded after this one
# still run; torch's, registered before, are skipped, and release only what the process's
# end releases anyway.
atexit.register(_leave)
