"""Case files from traces others captured: torch Flight Recorder JSON dumps."""

from __future__ import annotations

from pathlib import Path

from harness.record.cases import Recording
from harness.record.trace import TraceError


def recording_from_files(paths: list[Path]) -> Recording:
    """A Recording from Flight Recorder JSON dumps (one per rank)."""
    raise TraceError(f"{paths[0]}: --from-trace is not implemented yet")
