"""ci/gpu-check.sh and ci/gpu/gpu_wheels.py proven on a CPU machine, before a device is lent.

The dry run installs the device wheels for CPython 3.12 x86-64 with the network off, runs every
part (the CUDA ones skip with their reason) and checks that the output folder holds what a GPU
run writes. The wheels are downloaded once per module, as a maintainer does before a lease.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("nccl-ws1", "gloo-cuda", "ordering-nccl", "ordering-gloo-cuda", "probes", "record-nccl",
         "replay-nccl", "perf-nccl", "perf-gloo-cuda")
NO_REPORT = ("probes", "record-nccl")  # parts that write their own JSON, not a pytest report


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("whl")
    res = subprocess.run([sys.executable, "ci/gpu/gpu_wheels.py", "download", "--dest", str(dest)],
                         cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=_env())
    assert res.returncode == 0, res.stdout + res.stderr
    return dest


def _check(dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "ci/gpu/gpu_wheels.py", "check", "--dest", str(dest)],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=_env())


def test_the_wheel_check_names_a_missing_dependency_and_a_second_version(
        wheels: Path, tmp_path: Path) -> None:
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("jsonschema-") for n in names)
    assert any(n.startswith("google_re2-") for n in names)
    assert _check(wheels).returncode == 0
    short = tmp_path / "short"
    short.mkdir()
    for n in names:
        if not n.startswith("jsonschema-"):
            shutil.copy(wheels / n, short / n)
    res = _check(short)
    assert res.returncode == 1 and "jsonschema" in res.stdout + res.stderr
    twice = tmp_path / "twice"
    shutil.copytree(wheels, twice)
    ref = next(n for n in names if n.startswith("referencing-"))
    shutil.copy(wheels / ref, twice / ref.replace("referencing-0.", "referencing-99."))
    res = _check(twice)
    assert res.returncode == 1 and "referencing" in res.stdout + res.stderr


def test_gpu_check_refuses_a_folder_without_wheels_or_a_used_output_folder(
        tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    res = subprocess.run(["bash", "ci/gpu-check.sh", "--dry-run", "--wheels", str(empty),
                          "--out", str(tmp_path / "o1"), "--python", sys.executable],
                         cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=_env())
    assert res.returncode == 2 and "no wheels in" in res.stderr
    used = tmp_path / "used"
    used.mkdir()
    (used / "old.json").write_text("{}")
    res = subprocess.run(["bash", "ci/gpu-check.sh", "--dry-run", "--out", str(used)],
                         cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=_env())
    assert res.returncode == 2 and "is not empty" in res.stderr
    assert sorted(p.name for p in used.iterdir()) == ["old.json"]


def test_the_dry_run_installs_offline_runs_every_part_and_writes_the_folder(
        wheels: Path, tmp_path: Path) -> None:
    out = tmp_path / "gc"
    res = subprocess.run(["bash", "ci/gpu-check.sh", "--dry-run", "--out", str(out),
                          "--wheels", str(wheels), "--python", sys.executable,
                          "--budget", str(int(HANG_S))],
                         cwd=ROOT, capture_output=True, text=True, timeout=2 * HANG_S, env=_env())
    assert res.returncode == 0, res.stdout + res.stderr + (out / "install.log").read_text()
    for part in PARTS:  # one summary line per part on stdout
        assert f"gpu-check: {part}: exit" in res.stdout
    env = json.loads((out / "env.json").read_text())
    assert env["dry_run"] is True and env["gpus"] == 0 and env["device"] == "no GPU"
    rows = [line.split("\t") for line in (out / "parts.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == ["install", *PARTS]
    assert rows[0][1] == "0"  # the offline install of the wheels and the project worked
    # No part has a limit of its own in a dry run (a busy runner took more than the record
    # part's 120 s): each may use what is left of the budget, more than any part's GPU share.
    assert all(int(r[4]) > 200 for r in rows[1:]), rows
    summary = json.loads((out / "summary.json").read_text())
    by_part = {p["part"]: p for p in summary["parts"]}
    assert set(PARTS) <= set(by_part)
    # Without a GPU the record part records the Gloo/CPU run and still compares the parameters.
    recording = json.loads((out / "record.json").read_text())
    assert recording["gpu"] is False and recording["bit_identical"] is True
    assert recording["devices"] == ["cpu"] and recording["cases"] > 0
    for part in PARTS:
        if part in NO_REPORT:
            continue
        report = json.loads((out / f"{part}.json").read_text())
        assert report["session"]["complete"] is True
        # No GPU: every CUDA or NCCL instance is skipped with its reason, none called passed
        # (`-k cuda` also selects cases/cuda.yaml's CPU instances, which do run on Gloo).
        gpu = [r for r in report["records"] if r["device"] == "cuda" or r["backend"] == "nccl"]
        assert gpu, part
        assert {r["outcome"] for r in gpu} == {"skipped"}, part
        assert all(r["reason"] for r in gpu)
        for ext in ("md", "html", "log"):
            assert (out / f"{part}.{ext}").stat().st_size > 0
    assert (out / "summary.md").read_text().startswith("#")
