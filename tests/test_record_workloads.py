"""collective-record on real workloads (issue 28): DDP, a pipeline's point-to-point, DTensor and
FSDP2 recorded as the committed case files, replayed on Gloo (they pass) and on the mutant
backend (they fail), and the recorder leaves what DDP computes alone."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from .helpers import REPO, load_report, run_pytest
from .record_helpers import PY, cases_of, record, run_program

# example -> a fault of harness/mutate/faults.py that touches the ops it issues
WORKLOADS = {
    "ddp_buckets": "large_all_reduce_wrong",  # its 1.6 MB gradient bucket
    "pipeline_p2p": "recv_unwritten",
    "dtensor_redistribute": "dropped_contribution",  # Partial -> Shard(0) reduce_scatter
    "fsdp2_tiny": "dropped_contribution",  # the gradients' reduce_scatter
}


def _shipped(name: str) -> Path:
    return REPO / "cases" / "recorded" / f"{name}.yaml"


@pytest.fixture(scope="module")
def ddp_recorded(tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The DDP example recorded once, its parameters written to rec.bin: two tests read it
    (the recording, and what DDP computed under it)."""
    where = tmp_path_factory.mktemp("ddp")
    return where, record(where, PY, "examples/ddp_buckets.py", "--out", str(where / "rec.bin"))


@pytest.fixture(scope="module")
def shipped_on_gloo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The four committed recordings replayed on Gloo in one child session (one pytest start
    instead of four); each workload's test checks the records of its own file."""
    where = tmp_path_factory.mktemp("gloo")
    res = run_pytest(REPO, *(str(_shipped(n)) for n in sorted(WORKLOADS)), "-q",
                     "--report-json", str(where / "ok.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    return load_report(where / "ok.json")


@pytest.fixture(scope="module")
def shipped_on_the_mutant(tmp_path_factory: pytest.TempPathFactory
                          ) -> dict[str, dict[str, Any]]:
    """The committed recordings replayed on the mutant backend, one child session per fault
    with every workload that fault is chosen for (DTensor and FSDP2 share one): the report of
    each workload's session, by workload."""
    where = tmp_path_factory.mktemp("mutant")
    got: dict[str, dict[str, Any]] = {}
    for fault in sorted(set(WORKLOADS.values())):
        names = sorted(n for n, f in WORKLOADS.items() if f == fault)
        out = where / f"{fault}.json"
        res = run_pytest(REPO, *(str(_shipped(n)) for n in names), "-q", "--backend-module",
                         "harness.mutate.backend", "--backend", "mutant", "--report-json",
                         str(out), extra_env={"COLLECTIVE_MUTANT": fault})
        assert res.returncode != 0, res.stdout
        got.update(dict.fromkeys(names, load_report(out)))
    return got


def _records_of(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in report["records"] if r["file"] == f"cases/recorded/{name}.yaml"]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_a_workload_recorded_replays_on_gloo_and_the_mutant_fails(
        tmp_path: Path, name: str, request: pytest.FixtureRequest,
        shipped_on_gloo: dict[str, Any], shipped_on_the_mutant: dict[str, dict[str, Any]]
) -> None:
    if name == "ddp_buckets":  # recorded once for this test and the next one
        recorded, res = request.getfixturevalue("ddp_recorded")
        tmp_path = recorded
    else:
        res = record(tmp_path, PY, f"examples/{name}.py")
    assert res.returncode == 0, res.stderr
    shipped = _shipped(name)
    # the committed file is what the recorder writes today (only the header comment differs)
    assert cases_of(tmp_path / "out.yaml") == cases_of(shipped)
    assert shipped_on_gloo["summary"]["verdict"] == "PASS"
    mine = _records_of(shipped_on_gloo, name)
    assert {r["case"] for r in mine} == {str(c["name"]) for c in cases_of(shipped)}
    assert all(r["outcome"] == "passed" for r in mine), [(r["key"], r["outcome"]) for r in mine]
    bad = shipped_on_the_mutant[name]
    assert bad["summary"]["verdict"] == "FAIL"
    # the fault chosen for this workload fails a case of this workload's own file
    assert any(r["outcome"] == "failed" for r in _records_of(bad, name)), [
        (r["key"], r["outcome"]) for r in _records_of(bad, name)]


def test_the_ddp_workload_has_several_buckets_and_the_initial_broadcast() -> None:
    cases = {c["name"]: c for c in cases_of(_shipped("ddp_buckets"))}
    grads = cases["all_reduce_float32_sum_async"]
    assert isinstance(grads["shape"], list) and len(grads["shape"]) >= 2
    assert "issued from C++" in str(grads["description"])
    assert "_sync_module_states" in str(cases["broadcast_float32"]["description"])


def test_recording_does_not_change_what_ddp_computes(
        tmp_path: Path, ddp_recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    plain = tmp_path / "plain.bin"
    run_program("examples/ddp_buckets.py", "--out", str(plain))
    recorded, res = ddp_recorded
    assert res.returncode == 0, res.stderr
    assert "36 call(s)" in res.stdout  # it did record
    assert plain.read_bytes() == (recorded / "rec.bin").read_bytes()
    assert len(plain.read_bytes()) > 1 << 20
