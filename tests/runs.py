"""Real conformance runs for the gate, HTML and JUnit tests.

Each run is a separate pytest process (as in CI) on ``tests/data/gate/cases.yaml`` copied into
a temporary project, so record keys read ``cases/cases.yaml::case[id]`` whatever the checkout.
``faulty`` runs use ``tests.fault_backend`` with ``COLLECTIVE_FAULT=wrong_value``: rank 1
corrupts its results, so every world-size-2 instance fails and world-size-1 ones still pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .helpers import HANG_S

REPO = Path(__file__).resolve().parent.parent
CASES = REPO / "tests" / "data" / "gate" / "cases.yaml"


@dataclass
class Run:
    """One finished pytest process and where its reports are."""

    project: Path
    returncode: int
    output: str

    @property
    def reports(self) -> Path:
        return self.project / "reports"

    @property
    def json(self) -> Path:
        return self.reports / "conformance.json"


def make_project(where: Path) -> Path:
    """A directory holding ``cases/cases.yaml`` and nothing else."""
    (where / "cases").mkdir(parents=True, exist_ok=True)
    shutil.copy(CASES, where / "cases" / "cases.yaml")
    return where


def run_pytest(project: Path, backend: str, *args: str, fault: str = "wrong_value") -> Run:
    """Run ``pytest cases`` in ``project`` on ``backend`` (``gloo`` or ``faulty``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLLECTIVE_FAULT": fault}
    cmd = [sys.executable, "-m", "pytest", "cases", "--rootdir=.", "-p", "no:cacheprovider", "-q",
           "--backend", backend, "--deadline", "30"]
    if backend == "faulty":
        cmd += ["--backend-module", "tests.fault_backend"]
    proc = subprocess.run([*cmd, *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=HANG_S, check=False)
    return Run(project, proc.returncode, proc.stdout + proc.stderr)
