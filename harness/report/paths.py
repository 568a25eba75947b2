"""Where reports can be written: checked before a run starts, and a fallback when a path
stops working during it, so that a run's records are never lost to an unusable path.

A session checks its report paths at start-up (:func:`unusable`): a path under a regular
file, a directory where a file is expected, a folder that cannot be created or written. Any
of these is a one-line usage error before a rank starts. If writing fails later anyway (the
disk filled up, the folder was removed or made read-only), the caller writes the report set
into :func:`fallback_dir` instead and says where.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def unusable(path: str) -> str:
    """Why a report cannot be written at ``path`` ("" when it can). Creates the missing
    folders (as the writer would) and a probe file, removed again at once."""
    target = Path(path)
    if target.is_dir():
        return "it is a directory; give a file name"
    for parent in [target.parent, *target.parent.parents]:
        if parent.exists():
            if not parent.is_dir():
                return f"{parent} is a file, not a folder"
            break
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=target.parent, prefix=".tmp-probe-")
    except OSError as exc:
        return f"cannot write in {target.parent}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(probe)
    return ""


def fallback_dir() -> str:
    """A new private folder for a report set whose own paths failed."""
    return tempfile.mkdtemp(prefix="collective-harness-report-")


def fallback_paths(paths: list[str], folder: str) -> list[str]:
    """The report files' names, in ``folder``."""
    return [os.path.join(folder, os.path.basename(p) or f"report{i}")
            for i, p in enumerate(paths)]
