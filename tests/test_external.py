"""External-ranks mode: the library on the ranks a launcher gives, packed, resumed, one report.

The runs use the real launchers' ways in: torchrun (standalone, and two agents on one machine
with a c10d rendezvous on 127.0.0.1) and SLURM's environment variables.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.external import schedule
from harness.model import Instance

from .helpers import (
    HANG_S,
    PYTHON,
    finish,
    free_port,
    load_report,
    outcomes,
    start,
    subprocess_env,
    write_case_file,
)

BASIC = """
cases:
  - name: ar
    op: all_reduce
    world_size: [2, 4]
    reduce_op: [sum, max]
    shape: [5]
    input: "rank * 7 + i"
  - name: ring
    world_size: 2
    tensors:
      a: {shape: [3], init: "rank * 10 + i"}
      b: {shape: [3], init: poison}
    steps:
      - {op: isend, tensor: a, dst: "(rank + 1) % world_size", handle: s}
      - {op: irecv, tensor: b, src: "(rank - 1) % world_size", handle: r}
      - {wait: [s, r]}
    expected:
      b: "((rank - 1) % world_size) * 10 + i"
  - name: declared_hang
    world_size: 2
    hangs: true
    deadline: 2
    tensors: {t: {shape: [1], init: zeros}}
    steps:
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {}
  - name: on_gpu
    op: all_reduce
    device: cuda
    world_size: 2
    shape: [2]
    input: "i"
"""

# Every kind of instance external mode must place: packed ones of several sizes, rooted ops
# with a non-zero root (rank arguments are instance ranks), point-to-point, a program with a
# subgroup of its own, every-rank instances, an unexpected hang, a declared hang and a crash.
MIXED = """
cases:
  - name: ar
    op: all_reduce
    world_size: [1, 2, 3, launched]
    reduce_op: [sum, max]
    shape: [5]
    input: "rank * 7 + i"
  - name: bc
    op: broadcast
    world_size: 2
    args: {src: [0, 1]}
    shape: [4]
    input: "rank * 10 + i"
  - name: ring
    world_size: 2
    tensors:
      a: {shape: [3], init: "rank * 10 + i"}
      b: {shape: [3], init: poison}
    steps:
      - {op: isend, tensor: a, dst: "(rank + 1) % world_size", handle: s}
      - {op: irecv, tensor: b, src: "(rank - 1) % world_size", handle: r}
      - {wait: [s, r]}
    expected:
      b: "((rank - 1) % world_size) * 10 + i"
  - name: sub
    op: all_reduce
    world_size: 3
    args: {group: [0, 2]}
    shape: [2]
    input: "rank + i"
  - name: stuck
    world_size: 2
    deadline: 2
    tensors: {t: {shape: [1], init: zeros}}
    steps:
      # from any rank (not matched at collection), on a tag no other instance uses
      - {op: recv, tensor: t, tag: 7, ranks: [1]}
    expected: {t: 0}
  - name: declared_hang
    world_size: 2
    hangs: true
    deadline: 2
    tensors: {t: {shape: [1], init: zeros}}
    steps:
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {}
  - name: declared_crash
    world_size: 2
    crashes: true
    tensors: {t: {shape: [1], init: zeros}}
    steps:
      - {segfault: true, ranks: [1]}
      - {op: all_reduce, tensor: t}
    expected: {}
"""


def _without(text: str, case: str) -> str:
    """The case file ``text`` without the case named ``case`` (up to the next case)."""
    head, rest = text.split(f"  - name: {case}\n", 1)
    return head + ("  - name: " + rest.split("  - name: ", 1)[1] if "  - name: " in rest
                   else "")


def _write(tmp_path: Path, text: str) -> Path:
    return write_case_file(tmp_path, text) / "c.yaml"


def torchrun(tmp_path: Path, *launcher: str, report: str = "r", timeout: float = HANG_S
             ) -> subprocess.Popen[str]:
    return start(tmp_path, [
        PYTHON, "-m", "torch.distributed.run", *launcher, "-m", "harness.external",
        "c.yaml", "--report-json", f"{report}.json", "--report-md", f"{report}.md",
        "--deadline", "20"])


def pools(tmp_path: Path) -> dict[str, str]:
    """The harness's own pools on the same file: the verdicts external mode must match."""
    res = subprocess.run(
        [PYTHON, "-m", "pytest", "c.yaml", "-q", "-p", "no:cacheprovider", "--report-json",
         "pools.json", "--report-md", "pools.md", "--report-html", "pools.html"],
        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S, env=subprocess_env())
    assert (tmp_path / "pools.json").exists(), res.stdout[-3000:]
    return outcomes(load_report(tmp_path / "pools.json"))


# -- the schedule (pure) -----------------------------------------------------------------------

def _instances(text: str, world: int) -> list[Instance]:
    doc = yamlload.load_text(textwrap.dedent(text), "c.yaml")
    return [i for c in validate.load_cases(doc)
            for i in expand.expand(c, "gloo", launched=world)]


def test_schedule_packs_disjoint_blocks_and_runs_poisoning_instances_alone_last() -> None:
    insts = _instances(MIXED, 4)
    rounds = schedule.plan(insts, 4, [True] * len(insts))
    placed = sorted(s.index for r in rounds for s in r.slots)
    assert placed == list(range(len(insts)))  # every instance exactly once
    for r in rounds:
        ranks = [g for s in r.slots for g in s.members]
        assert len(ranks) == len(set(ranks)) and max(ranks) < 4  # disjoint, in the world
        for s in r.slots:
            assert len(s.members) == insts[s.index].world_size
            assert list(s.members) == list(range(s.members[0], s.members[0] + len(s.members)))
    kinds = [r.alone for r in rounds]
    assert kinds == sorted(kinds, key=["", schedule.ALONE_GROUPS, schedule.ALONE_RESTART].index)
    alone = {insts[r.slots[0].index].case: r.alone for r in rounds if r.alone}
    assert alone == {"sub": "subgroups", "declared_hang": "restart", "declared_crash": "restart"}
    assert any(len(r.slots) > 1 for r in rounds)  # something actually shares a round
    # world_size: launched is the launched size, and a listed size equal to it is one instance
    assert sorted({i.world_size for i in insts if i.case == "ar"}) == [1, 2, 3, 4]
    unpacked = schedule.plan(insts, 4, [True] * len(insts), pack=False)
    assert all(len(r.slots) == 1 for r in unpacked) and len(unpacked) > len(rounds)


def test_schedule_skips_what_cannot_run_and_fingerprints_the_run() -> None:
    insts = _instances(MIXED, 2)
    runnable = [i.case != "bc" for i in insts]
    rounds = schedule.plan(insts, 2, runnable)
    names = {insts[s.index].case for r in rounds for s in r.slots}
    assert "bc" not in names and "sub" not in names  # skipped; world size 3 > 2
    fp = schedule.fingerprint(insts, 2, rounds)
    assert fp == schedule.fingerprint(insts, 2, rounds)
    assert fp != schedule.fingerprint(insts, 2, rounds[:-1])


# -- real launches -------------------------------------------------------------------------------

def test_standalone_run_skips_what_the_launch_cannot_do(tmp_path: Path) -> None:
    _write(tmp_path, BASIC)
    res = finish(torchrun(tmp_path, "--standalone", "--nproc-per-node", "2"), HANG_S)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    report = load_report(tmp_path / "r.json")
    got = {r["key"]: r for r in report["records"]}
    assert got["c.yaml::ar[gloo-ws2-float32-sum-sync]"]["outcome"] == "passed"
    assert got["c.yaml::ring[gloo-ws2-float32-async]"]["outcome"] == "passed"
    ws4 = got["c.yaml::ar[gloo-ws4-float32-max-sync]"]
    assert ws4["outcome"] == "skipped" and "launched with 2" in ws4["reason"]
    # No restarts allowed: an instance that must hang is skipped, and says how to run it.
    hang = got["c.yaml::declared_hang[gloo-ws2-float32-sync]"]
    assert hang["outcome"] == "skipped" and "--max-restarts" in hang["reason"]
    # A CUDA instance on a machine without GPUs: skipped, not a crash at start.
    gpu = got["c.yaml::on_gpu[gloo-ws2-float32-sum-sync-cuda]"]
    assert gpu["outcome"] == "skipped" and "CUDA" in gpu["reason"]
    ring = got["c.yaml::ring[gloo-ws2-float32-async]"]
    assert [len(r["checks"]) for r in ring["ranks"]] == [2, 2]  # every rank's checks gathered
    assert [p["global_rank"] for p in ring["placement"]["ranks"]] == [0, 1]
    assert report["metadata"]["options"]["mode"] == "external"


def test_two_agents_pack_resume_after_hang_and_crash_and_match_the_pools(
        tmp_path: Path) -> None:
    """Two torchrun agents (a 2-node launch on one machine): every instance gets a record,
    the verdicts are the pools' verdicts, and the hang and the crash did not end the run.
    Without MIXED's declared hang: its relaunch cost both agents a restart of their ranks,
    and a declared hang run under restarts is the sbatch test's (its placement the
    schedule's)."""
    _write(tmp_path, _without(MIXED, "declared_hang"))
    port = free_port()
    common = ("--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t", "--max-restarts", "4")
    second = torchrun(tmp_path, *common)  # rank 0 writes r.json, whichever agent has it
    first = finish(torchrun(tmp_path, *common), HANG_S)
    finish(second, HANG_S)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    report = load_report(tmp_path / "r.json")
    external = outcomes(report)
    assert external == pools(tmp_path)  # every instance, the same verdicts
    assert external["c.yaml::stuck[gloo-ws2-float32-sync]"] == "hang"
    by_key = {r["key"]: r for r in report["records"]}
    stuck = by_key["c.yaml::stuck[gloo-ws2-float32-sync]"]
    assert "rank 1: BLOCKED in step 0" in stuck["message"] and "in recv" in stuck["message"]
    assert "rank 0: finished" in stuck["message"]
    crash = by_key["c.yaml::declared_crash[gloo-ws2-float32-sum-sync]"]
    assert crash["ranks"][1]["state"] == "died"
    # Packed: instances of one round ran on disjoint ranks at the same time.
    rounds: dict[int, list[int]] = {}
    for r in report["records"]:
        if "placement" in r:
            rounds.setdefault(r["placement"]["round"], []).extend(
                p["global_rank"] for p in r["placement"]["ranks"])
    shared = [ranks for ranks in rounds.values() if len(ranks) > 2]
    assert shared and all(len(set(ranks)) == len(ranks) for ranks in rounds.values())
    assert "c.yaml::declared_hang[gloo-ws2-float32-sync]" not in external
    assert report["metadata"]["options"]["attempt"] >= 2  # hang, crash: restarts


def test_slurm_environment_and_resume_by_hand(tmp_path: Path) -> None:
    """srun sets SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID and restarts nothing: an unexpected
    hang ends the job, and the same command with --resume finishes the run."""
    _write(tmp_path, MIXED.replace("world_size: [1, 2, 3, launched]", "world_size: [1, 2]"))
    port = free_port()

    def srun(*extra: str) -> list[subprocess.CompletedProcess[str]]:
        procs = []
        for rank in range(2):
            env = subprocess_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2",
                                 SLURM_LOCALID=str(rank), MASTER_ADDR="127.0.0.1",
                                 MASTER_PORT=str(port))
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT",
                      "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE"):
                env.pop(k, None)
            procs.append(start(tmp_path, [
                PYTHON, "-m", "harness.external", "c.yaml", "--report-json", "r.json",
                "--report-md", "r.md", "--deadline", "20", *extra], env=env))
        return [finish(p, HANG_S) for p in procs]

    first = srun()
    assert any(p.returncode != 0 for p in first)  # the hang ended the job
    partial_report = load_report(tmp_path / "r.json")
    # What ran passed, but the run did not finish: never PASS.
    assert partial_report["summary"]["verdict"] == "INCOMPLETE"
    assert partial_report["session"]["complete"] is False
    partial = outcomes(partial_report)
    assert "c.yaml::stuck[gloo-ws2-float32-sync]" not in partial
    assert partial["c.yaml::ring[gloo-ws2-float32-async]"] == "passed"
    second = srun("--resume")
    assert all(p.returncode == 0 for p in second), second[0].stderr[-3000:]
    final = load_report(tmp_path / "r.json")
    assert final["session"]["complete"] is True
    done = outcomes(final)
    assert done["c.yaml::stuck[gloo-ws2-float32-sync]"] == "hang"
    assert set(partial) < set(done)
    # No restarts under srun: what must hang or crash is skipped with the reason.
    assert done["c.yaml::declared_crash[gloo-ws2-float32-sum-sync]"] == "skipped"


def test_perf_mode_under_a_launcher(tmp_path: Path) -> None:
    """--perf on 4 launched ranks: world-size-2 instances run on a subgroup, one at a time,
    and get numbers; an instance too large for the launch gets none."""
    _write(tmp_path, BASIC)
    res = finish(start(tmp_path, [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "-m", "harness.external", "c.yaml", "--report-json", "r.json", "--report-md",
        "r.md", "--perf", "--perf-warmup", "1", "--perf-iters", "2", "--perf-min-time", "0",
        "--perf-repeats", "2", "-k", "ar["]), 240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    report = load_report(tmp_path / "r.json")  # schema-valid, perf sections included
    recs = {r["case"] + "[" + r["id"] + "]": r for r in report["records"]}
    ar = recs["ar[gloo-ws2-float32-sum-sync]"]["perf"]
    assert ar["time_us"] > 0 and ar["repeats"] == 2 and ar["bytes"] == 5 * 4
    assert ar["busbw_gbs"] == ar["algbw_gbs"]  # 2(n-1)/n = 1 at n = 2
    assert recs["ar[gloo-ws4-float32-max-sync]"]["perf"]["time_us"] > 0
    assert report["metadata"]["options"]["packed"] is False
    assert report["metadata"]["options"]["perf"]["iters"] == 2
    rounds = [r["placement"]["round"] for r in report["records"] if "placement" in r]
    assert len(rounds) == len(set(rounds))  # one instance per round while timing


def test_external_module_needs_a_launcher(tmp_path: Path) -> None:
    _write(tmp_path, BASIC)
    env = subprocess_env()
    for k in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        env.pop(k, None)
    res = subprocess.run([PYTHON, "-m", "harness.external", "c.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=HANG_S, env=env)
    assert res.returncode != 0
    assert "start it with torchrun, srun or mpirun" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.fixture(autouse=True)
def _no_inherited_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("TORCHELASTIC_", "SLURM_")):
            monkeypatch.delenv(k)
    assert sys.executable


def test_the_sbatch_script_runs_under_slurms_commands(tmp_path: Path) -> None:
    """ci/slurm/external.sbatch with stand-ins for srun and scontrol on one node: it starts
    torchrun with restarts and the run writes its report."""
    _write(tmp_path, BASIC)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nshift\nexec "$@"\n')  # drops --kill-on-bad-exit
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {PYTHON} "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = subprocess_env(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="n1",
                         SLURM_NNODES="1", SLURM_JOB_ID="42", RANKS_PER_NODE="2",
                         RDZV_PORT=str(free_port()))
    script = Path(__file__).resolve().parents[1] / "ci" / "slurm" / "external.sbatch"
    res = finish(start(tmp_path, ["bash", str(script), "c.yaml", "--report-json", "r.json",
                                     "--report-md", "r.md"], env=env), 240)
    assert res.returncode == 0, res.stderr[-3000:]
    got = outcomes(load_report(tmp_path / "r.json"))
    assert got["c.yaml::ring[gloo-ws2-float32-async]"] == "passed"
    # torchrun gave restarts: the declared hang ran (alone, then a relaunch) instead of a skip
    assert got["c.yaml::declared_hang[gloo-ws2-float32-sync]"] == "passed"


PARITY = """
cases:
  - name: ar
    op: all_reduce
    world_size: 2
    async: [true, false]
    dtype: [float32, int64]
    shape: [6]
    input: "rank * 5 + i"
    expected: auto
  - name: bc
    op: broadcast
    world_size: 2
    async: true
    args: {src: 1}
    shape: [4]
    input: "rank * 10 + i"
  - name: ring
    world_size: 2
    tensors:
      a: {shape: [3], init: "rank * 10 + i"}
      b: {shape: [3], init: poison}
    steps:
      - {op: isend, tensor: a, dst: "(rank + 1) % world_size", handle: s}
      - {op: irecv, tensor: b, src: "(rank - 1) % world_size", handle: r}
      - {wait: [s, r]}
    expected:
      b: "((rank - 1) % world_size) * 10 + i"
  - name: rejected
    op: all_reduce
    world_size: 2
    reduce_op: bxor
    shape: [4]
    input: "rank + i"
    raises: "BXOR|non-integral|not supported"
  - name: old_torch_only
    op: all_reduce
    world_size: 2
    shape: [2]
    input: "rank"
    overrides:
      - when: {backend: gloo, torch: "<1.0"}
        xfail: true
        reason: a divergence of torch before 1.0
"""

# What differs by construction between the two ways of running: the node id pytest gives,
# where and when it ran (placement, phases, durations), and the raw timings and timing-led
# observations each rank makes (the verdict drawn from them is compared: each check's status).
RUN_MODE_FIELDS = ("nodeid", "duration_s", "phases", "placement", "ran_ahead")


def _comparable(rec: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in rec.items() if k not in RUN_MODE_FIELDS}
    out["ranks"] = [{"rank": r.get("rank"), "status": r.get("status"),
                     "checks": r.get("checks"), "raised": r.get("raised"),
                     "steps": [e.get("what") for e in r.get("events", [])]}
                    for r in rec.get("ranks", [])]
    ordering = rec.get("ordering") or {}
    out["ordering"] = {k: (v["status"] if isinstance(v, dict) and "status" in v else v)
                       for k, v in ordering.items()}
    if "message" in out and ordering:  # an ordering detail quotes a measured time
        out["message"] = out["message"].split("\n")[0]
    return out


def test_the_same_cases_give_the_same_records_under_pytest_and_a_launcher(
        tmp_path: Path) -> None:
    """Two torchrun agents (one rank each) and the harness's own pools run one file with
    every ordering probe and --check-iters 3: the records agree field by field but for the
    fields that name the run mode."""
    _write(tmp_path, PARITY)
    port = free_port()
    opts = ("--check-iters", "3", "--ordering", "all")
    common = ("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "parity")

    def agent() -> subprocess.Popen[str]:
        return start(tmp_path, [PYTHON, "-m", "torch.distributed.run", *common, "-m",
                                "harness.external", "c.yaml", "--report-json", "r.json",
                                "--report-md", "r.md", *opts])

    second = agent()
    first = finish(agent(), HANG_S)
    finish(second, HANG_S)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    res = subprocess.run(
        [PYTHON, "-m", "pytest", "c.yaml", "-q", "-p", "no:cacheprovider", *opts,
         "--report-json", "pools.json", "--report-md", "pools.md", "--report-html",
         "pools.html"], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S,
        env=subprocess_env())
    external = {r["key"]: r for r in load_report(tmp_path / "r.json")["records"]}
    pytest_run = {r["key"]: r for r in load_report(tmp_path / "pools.json")["records"]}
    assert set(external) == set(pytest_run) and len(external) == 8, res.stdout[-2000:]
    for key, rec in pytest_run.items():
        assert _comparable(external[key]) == _comparable(rec), key
    # What the comparison covers was checked, not skipped: probes ran, iterations were
    # counted, an override out of its torch scope is listed, a raise was matched.
    probed = [r for r in external.values() if (r.get("ordering") or {}).get("probes")]
    assert len(probed) == 3
    iterated = [r for r in external.values()
                if (r.get("numerics") or {}).get("properties", {}).get("iterations") == "held"]
    assert len(iterated) >= 4
    old = external["c.yaml::old_torch_only[gloo-ws2-float32-sum-sync]"]
    assert old["outcome"] == "passed" and old.get("overrides_not_applied")
    assert {r["outcome"] for r in external.values()} == {"passed"}
    options = load_report(tmp_path / "r.json")["metadata"]["options"]
    assert options["check_iters"] == 3 and options["ordering"] == "all"


MANIFEST_CASES = """\
cases:
  - name: ar
    op: all_reduce
    world_size: 2
    shape: [5]
    input: "rank + i"
  - name: bc
    op: broadcast
    world_size: 2
    args: {src: 0}
    shape: [5]
    input: "rank * 10 + i"
"""


def test_a_manifest_judges_the_same_under_a_launcher_as_under_pytest(tmp_path: Path) -> None:
    """--manifest in external mode: a declared gap the backend computes anyway is "not
    rejected" there as under pytest, a claimed op passes, and the backend comes from the
    manifest; a broken manifest is a usage error of one line, before any launch."""
    _write(tmp_path, MANIFEST_CASES)
    (tmp_path / "m.yaml").write_text("backend: gloo\nsupports:\n  ops: [all_reduce]\n")
    res = finish(start(tmp_path, [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "harness.external", "c.yaml", "--manifest", "m.yaml", "--report-json", "r.json",
        "--report-md", "r.md", "--deadline", "20"]), 240)
    external = {r["case"]: r for r in load_report(tmp_path / "r.json")["records"]}
    subprocess.run([PYTHON, "-m", "pytest", "c.yaml", "-q", "-p", "no:cacheprovider",
                    "--manifest", "m.yaml", "--report-json", "pools.json", "--report-md",
                    "pools.md", "--report-html", "pools.html"], cwd=tmp_path,
                   capture_output=True, text=True, timeout=240, env=subprocess_env())
    pytest_run = {r["case"]: r for r in load_report(tmp_path / "pools.json")["records"]}
    # The launcher's status says the run completed; the verdict is the report's.
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert external["ar"]["outcome"] == pytest_run["ar"]["outcome"] == "passed"
    assert external["bc"]["outcome"] == pytest_run["bc"]["outcome"] == "failed"
    assert "not rejected" in external["bc"]["message"]
    assert external["bc"]["message"] == pytest_run["bc"]["message"]
    (tmp_path / "bad.yaml").write_text("backend: gloo\nsupports:\n  ops: [all_reduse]\n")
    bad = subprocess.run([PYTHON, "-m", "harness.external", "c.yaml", "--manifest", "bad.yaml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=subprocess_env())
    assert bad.returncode == 2
    assert "bad.yaml:3:" in bad.stderr and "all_reduce" in bad.stderr  # the nearest name
    assert "Traceback" not in bad.stderr
