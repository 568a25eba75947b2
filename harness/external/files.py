"""What external mode reads and writes on disk: the case files to run, and the report pair
rank 0 keeps current (an INCOMPLETE report from the start, so that no earlier report can be
taken for this run's result)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..report import markdown
from ..report import paths as report_paths
from ..report.records import build_report, json_text, write_all

PROG = "python -m harness.external"


def case_files(paths: list[str]) -> list[Path]:
    """Case files under ``paths`` in a stable order (the same on every rank)."""
    out: list[Path] = []
    for p in map(Path, paths):
        files = sorted(p.rglob("*.y*ml")) if p.is_dir() else [p]
        out += [f for f in files if f.suffix in (".yaml", ".yml")
                and "\ncases:" in "\n" + f.read_text(encoding="utf-8", errors="replace")]
    return out


class ReportFiles:
    """Where rank 0 writes the report pair. If a path stops working during the run (the folder
    removed, the disk full), the pair goes to a new private folder instead, named once on
    stderr, and stays there for the rest of the run: the records are never lost."""

    def __init__(self, report_json: str, report_md: str) -> None:
        self.paths = [report_json, report_md]
        self.moved_to = ""

    def write(self, report: dict[str, Any]) -> None:
        """Replace both files together (JSON and Markdown never disagree)."""
        texts = (json_text(report), markdown.render(report))
        if self.moved_to:  # moved once: it stays there (a failure now is a real error)
            write_all(list(zip(self.paths, texts, strict=True)))
            return
        moved = report_paths.write_set(self.paths, texts)
        if moved is not None:
            print(f"{PROG}: could not write the report to "
                  f"{self.paths[0]} ({moved.why}); it is written to {moved.folder} instead",
                  file=sys.stderr, flush=True)
            self.moved_to, self.paths = moved.folder, moved.paths


def write_started(files: ReportFiles, backend: str) -> None:
    """Replace the report files by an INCOMPLETE report of this run before it loads anything,
    so that no earlier report can be taken for its result if it stops early (a bad case file,
    an unusable state directory, a crash before the first round)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    session = {"complete": False, "collected": 0, "without_result": 0,
               "ended_by": f"started at {started} (pid {os.getpid()}) and not finished: still "
                           "loading or running, or stopped before writing its report"}
    report = build_report([], {"torch": "", "hostname": socket.gethostname(),
                               "options": {"mode": "external", "backend": backend}}, session)
    files.write(report)
