"""What the collective-record tests share: running the recorder on a program, and reading the
case file it writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from .helpers import HANG_S, REPO

PY = sys.executable


def record(tmp: Path, *command: str, extra: tuple[str, ...] = ()
           ) -> subprocess.CompletedProcess[str]:
    """``collective-record`` (options ``extra``) on ``command``, run from the repository:
    the case file is ``tmp/out.yaml``, the traces are under ``tmp/traces``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([PY, "-m", "harness.record", *extra, "-o", str(tmp / "out.yaml"),
                           "--trace-dir", str(tmp / "traces"), "--", *command],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)


def run_program(*argv: str) -> None:
    """A Python program run from the repository without the recorder; fails if it does."""
    subprocess.run([PY, *argv], cwd=REPO, check=True, timeout=HANG_S,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def cases_of(path: Path) -> list[dict[str, object]]:
    """The cases of the case file at ``path``."""
    return list(yaml.safe_load(path.read_text())["cases"])
