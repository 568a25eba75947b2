"""Where a report set goes when its own paths stop working during a run, so that a run's
records are never lost to an unusable path.

Paths are checked before a run starts (:func:`harness.report.jsonfile.unwritable`: a path
under a regular file, a directory where a file is expected, a folder that cannot be written
are one-line usage errors). If writing fails later anyway (the disk filled up, the folder was
removed or made read-only), :func:`write_set` writes the set into a new private folder instead
and says where; the pytest plugin and the external runner both write through it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from .records import write_all


@dataclass(frozen=True)
class Moved:
    """A report set written elsewhere than asked: the folder, its files, and why."""

    folder: str
    paths: list[str]
    why: str


def write_set(paths: Sequence[str], texts: Sequence[str]) -> Moved | None:
    """Write ``texts`` to ``paths`` as one set; if that fails, into a new private folder
    (same file names) and say so. None when the set went where it was asked to."""
    try:
        write_all(list(zip(paths, texts, strict=True)))
        return None
    except OSError as exc:
        folder = tempfile.mkdtemp(prefix="collective-harness-report-")
        moved = [os.path.join(folder, os.path.basename(p) or f"report{i}")
                 for i, p in enumerate(paths)]
        write_all(list(zip(moved, texts, strict=True)))
        return Moved(folder, moved, str(exc.strerror or exc))
