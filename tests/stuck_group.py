"""A torch whose ``new_group`` never forms a subgroup, as a third-party backend may fail to.

Imported in every rank with ``--backend-module tests.stuck_group`` (the backend stays Gloo);
it changes nothing unless the rank's environment has ``STUCK_GROUP=1`` (the session's
environment), so the test process that imports it to probe the backend is left alone. Then
``new_group`` for fewer ranks than the world starts a thread that prints noise (a line longer
than the tail reads, a long line, a line with terminal escapes, ``STUCK_GROUP_NOISE`` more
lines) and dies of a ``KeyError``, as a backend's future callback does, and the calling thread
waits for it forever: the hang's only account is what that thread printed.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import torch.distributed as dist

_REAL = dist.new_group
KEY = "fut-17"


def _handler() -> None:
    print("x" * 100_000, file=sys.stderr, flush=True)
    print("y" * 1_000, file=sys.stderr, flush=True)
    print("backend callback: \x1b[31mred\x1b[0m", file=sys.stderr, flush=True)
    for i in range(int(os.environ.get("STUCK_GROUP_NOISE", "0"))):
        print(f"noise {i}", file=sys.stderr, flush=True)
    futures: dict[str, object] = {}
    futures[KEY]  # the KeyError the thread dies of (threading's excepthook prints it)


def _stuck_new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
    if ranks is not None and len(ranks) < dist.get_world_size():
        thread = threading.Thread(target=_handler, name="future-handler")
        thread.start()
        thread.join()
        threading.Event().wait()
    return _REAL(ranks, *args, **kwargs)


if os.environ.get("STUCK_GROUP") == "1":
    dist.new_group = _stuck_new_group
