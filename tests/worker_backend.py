"""A backend that starts a process of its own, as torchft's ``ProcessGroupBabyGloo`` does.

Import it with ``--backend-module tests.worker_backend`` and run ``--backend worker``: stock
Gloo, whose factory first starts a helper from a ``multiprocessing`` spawn context (daemonic,
as BabyGloo's worker is) that sleeps until it is killed and never looks at its parent. The
helper is a child of the rank that created the group; nothing but the harness ends it, so a
test finds whether the harness does by looking for it (it carries the rank's environment, a
test's ``COLLECTIVE_TEST_MARKER`` included). ``COLLECTIVE_HELPERS`` (read when the group is
made) starts that many helpers per rank instead of one.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# Held for the rank's life, as a backend holds its worker.
HELPERS: list[Any] = []


def _factory(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    ctx = multiprocessing.get_context("spawn")
    for _ in range(int(os.environ.get("COLLECTIVE_HELPERS", "1"))):
        # time.sleep itself as the target: the helper imports nothing (no torch).
        helper = ctx.Process(target=time.sleep, args=(10**8,), name="helper", daemon=True)
        helper.start()
        HELPERS.append(helper)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


dist.Backend.register_backend("worker", _factory, devices=["cpu"])
