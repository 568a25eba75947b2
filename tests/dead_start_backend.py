"""A backend whose process group cannot start: what torchft's did inside the harness's ranks.

Import it with ``--backend-module tests.dead_start_backend`` and run ``--backend deadstart``:
Gloo behind :class:`harness.backends.wrapping.WrappingProcessGroup`, whose factory raises
when the ranks form the group, as a backend that starts a worker process of its own does in a
daemonic rank ("daemonic processes are not allowed to have children"). ``DEAD_START`` (read in
each rank when the group is made) says when:

- ``always``: every start fails (the tests count how many pools the harness tried);
- ``first``: only the first start of the session fails (a flaky start, not a dead backend).

Rank 0 appends a line to the file ``DEAD_START_LOG`` names on every start, before it decides:
the tests count the pool starts there, and ``first`` reads its own count from it.
"""

# mypy: disable-error-code="override,call-arg,misc"
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from harness.backends.wrapping import WrappingProcessGroup

MODES = ("always", "first")


class DeadStart(WrappingProcessGroup):
    """Gloo, unless the start fails as ``DEAD_START`` says."""

    backend_name = "deadstart"

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        mode = os.environ.get("DEAD_START", "always")
        if mode not in MODES:
            raise ValueError(f"DEAD_START={mode!r}; choose one of {MODES}")
        starts = 0
        log = os.environ.get("DEAD_START_LOG", "")
        if rank == 0 and log:
            with open(log, "a+", encoding="utf-8") as f:
                f.write("start\n")
                f.seek(0)
                starts = len(f.read().splitlines())
        # Rank 0 alone raises: the others wait for it in the rendezvous until the pool is
        # stopped, so that every start is in the log before it fails.
        if rank == 0 and (mode == "always" or starts == 1):
            raise AssertionError("daemonic processes are not allowed to have children")
        super().__init__(store, rank, size, timeout)


DeadStart.register()
