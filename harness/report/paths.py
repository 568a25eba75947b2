"""Where a report set goes when its own paths stop working during a run, so that a run's
records are never lost to an unusable path.

Paths are checked before a run starts (:func:`harness.report.jsonfile.unwritable`: a path
under a regular file, a directory where a file is expected, a folder that cannot be written
are one-line usage errors). If writing fails later anyway (the disk filled up, the folder was
removed or made read-only), the caller writes the set into :func:`fallback_dir` instead and
says where.
"""

from __future__ import annotations

import os
import tempfile


def fallback_dir() -> str:
    """A new private folder for a report set whose own paths failed."""
    return tempfile.mkdtemp(prefix="collective-harness-report-")


def fallback_paths(paths: list[str], folder: str) -> list[str]:
    """The report files' names, in ``folder``."""
    return [os.path.join(folder, os.path.basename(p) or f"report{i}")
            for i, p in enumerate(paths)]
