"""External-ranks mode: the same cases under torchrun, one report from rank 0."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from .helpers import PYTHON, load_report, subprocess_env

CASES = """
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
  - name: needs_isolation
    world_size: 2
    hangs: true
    tensors: {t: {shape: [1], init: zeros}}
    steps:
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {}
"""

HANG = """
cases:
  - name: first
    op: all_reduce
    world_size: 2
    shape: [2]
    input: "i"
  - name: stuck
    world_size: 2
    deadline: 2
    tensors: {t: {shape: [1], init: zeros}}
    steps:
      - {op: recv, tensor: t, src: 0, ranks: [1]}
    expected: {}
"""


def torchrun(tmp_path: Path, text: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "c.yaml").write_text(textwrap.dedent(text))
    return subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "harness.run.external", "c.yaml", "--report-json", "r.json", "--report-md", "r.md",
         *extra],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, env=subprocess_env())


def test_lockstep_run_writes_one_report(tmp_path: Path) -> None:
    res = torchrun(tmp_path, CASES)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    report = load_report(tmp_path / "r.json")
    outcomes = {r["key"]: r["outcome"] for r in report["records"]}
    assert outcomes["c.yaml::ar[gloo-ws2-float32-sum-sync]"] == "passed"
    assert outcomes["c.yaml::ring[gloo-ws2-float32]"] == "passed"
    assert outcomes["c.yaml::ar[gloo-ws4-float32-max-sync]"] == "skipped"
    assert outcomes["c.yaml::needs_isolation[gloo-ws2-float32-sync]"] == "skipped"
    ring = next(r for r in report["records"] if r["case"] == "ring")
    assert [len(r["checks"]) for r in ring["ranks"]] == [2, 2]  # every rank's checks gathered
    assert report["metadata"]["options"]["mode"] == "external"
    assert report["session"]["complete"] is True


def test_perf_mode_under_a_launcher(tmp_path: Path) -> None:
    res = torchrun(tmp_path, CASES, "--perf", "--perf-warmup", "1", "--perf-iters", "2",
                   "--perf-min-time", "0", "--perf-repeats", "2")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    report = load_report(tmp_path / "r.json")  # schema-valid, perf sections included
    recs = {r["case"] + "[" + r["id"] + "]": r for r in report["records"]}
    ar = recs["ar[gloo-ws2-float32-sum-sync]"]["perf"]
    assert ar["time_us"] > 0 and ar["repeats"] == 2 and ar["bytes"] == 5 * 4
    assert ar["busbw_gbs"] == ar["algbw_gbs"]  # 2(n-1)/n = 1 at n = 2
    assert recs["ring[gloo-ws2-float32]"]["perf"]["op"] == "isend+irecv"
    assert "perf" not in recs["ar[gloo-ws4-float32-max-sync]"]  # skipped: no numbers
    assert len(report["perf"]["points"]) == 3
    assert report["metadata"]["options"]["perf"]["iters"] == 2


def test_a_hang_ends_the_run_but_keeps_earlier_results(tmp_path: Path) -> None:
    res = torchrun(tmp_path, HANG)
    assert res.returncode != 0
    assert "rank 1: HANG in c.yaml::stuck[gloo-ws2-float32-sync]" in res.stderr
    assert "in recv" in res.stderr  # the stuck rank's Python stack
    report = load_report(tmp_path / "r.json")
    assert [(r["case"], r["outcome"]) for r in report["records"]] == [("first", "passed")]
    # What ran passed, but the run did not finish: never PASS.
    assert report["summary"]["verdict"] == "INCOMPLETE"
    assert report["session"]["complete"] is False
    assert "stopped in c.yaml::stuck[gloo-ws2-float32-sync]" in report["session"]["ended_by"]
