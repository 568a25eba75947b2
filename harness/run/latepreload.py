"""Imported last by an early-started forkserver: the modules the session's cases need too.

:func:`harness.run.forkserver.start_early` starts the forkserver before collection has said
which torch modes the cases use (``torch.use_deterministic_algorithms`` imports
``torch._inductor``: 1.5 s, better once here than in every rank). The forkserver imports
torch, then this module, which connects to the parent's socket (its path in :data:`ENV`),
reads the list of module names the parent sends once collection is over (or as soon as the
parent needs a process) and imports them. The parent's death closes the socket: the list is
then empty and the forkserver, its parent gone, ends as it always does. Never raises: a
module that fails to import costs the ranks time, as a failed preload does in
``multiprocessing``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket

ENV = "COLLECTIVE_HARNESS_LATE_PRELOAD"
MAX_LIST_BYTES = 1 << 20


def receive(path: str) -> list[str]:
    """The module names the parent sends on the socket at ``path`` ([] if it sends none)."""
    chunks: list[bytes] = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        size = 0
        while size < MAX_LIST_BYTES:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    try:
        names = json.loads(b"".join(chunks) or b"[]")
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _load() -> None:
    path = os.environ.pop(ENV, "")
    if not path:
        return
    for name in receive(path):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


_load()
