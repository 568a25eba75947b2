"""Where the time goes (issue 25, point 1): every executed record carries its phases, the
summary totals them, and ``collective-bench --costs`` prints the top cost centres."""

from __future__ import annotations

import json
from pathlib import Path

from harness.bench.overhead import bench_hang
from harness.bench.overhead import main as bench_main
from harness.report import costs

from .helpers import load_report, run_pytest, write_case_file

CASES = """
cases:
  - name: plain
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
  - name: napping
    world_size: 2
    tensors: {t: {shape: [2], init: "rank"}}
    steps:
      - {sleep: 0.3}
      - {op: all_reduce, tensor: t}
    expected: {t: "world_size * (world_size - 1) / 2"}
  - name: rejected
    op: all_reduce
    world_size: 2
    dtype: int64
    reduce_op: avg
    shape: [2]
    input: "i"
    overrides:
      - {when: {backend: gloo}, raises: ".", reason: Gloo has no integer AVG}
"""


def test_records_and_summary_say_where_the_time_went(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    write_case_file(tmp_path, CASES)
    res = run_pytest(tmp_path, "c.yaml", "-q", "--rootdir", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    rep = load_report(tmp_path / "reports" / "conformance.json")
    by_case = {r["case"]: r for r in rep["records"]}
    for r in rep["records"]:
        ph = r["phases"]
        assert set(ph) >= {"pool_s", "run_s", "ranks_s", "transport_s", "judge_s", "settle_s"}
        assert ph["ranks_s"] <= ph["run_s"] + 1e-6
        assert ph.get("probes_s", 0.0) <= ph["ranks_s"] + 1e-6  # probes run in the ranks
    # The case's own sleep is counted as such, inside the ranks' time.
    nap = by_case["napping"]["phases"]
    assert 0.3 <= nap["sleep_s"] <= nap["ranks_s"] + 1e-6
    assert "sleep_s" not in by_case["plain"]["phases"]
    # A rejected call costs a health check before the pool is reused.
    assert by_case["rejected"]["outcome"] == "limitation"
    assert by_case["rejected"]["phases"]["settle_s"] > by_case["plain"]["phases"]["settle_s"]
    block = rep["summary"]["time"]
    assert abs(block["phases_s"]["sleep_s"] - nap["sleep_s"]) < 0.01
    assert block["by_file"][0]["file"] == "c.yaml" and block["by_file"][0]["instances"] == 3
    assert bench_main(["--costs", str(tmp_path / "reports" / "conformance.json")]) == 0
    out = capsys.readouterr().out
    assert "| sleep_s |" in out and "| c.yaml | 3 |" in out


def test_costs_of_a_report_without_phases_still_list_files() -> None:
    block = costs.totals([{"file": "a.yaml", "duration_s": 2.0, "pool_replaced": True},
                          {"file": "b.yaml", "duration_s": 1.0},
                          {"file": "a.yaml", "duration_s": 1.0, "phases": {"pool_s": 0.5}}])
    assert block["phases_s"] == {"pool_s": 0.5}
    assert [(f["file"], f["instances"], f["seconds"], f["pools_replaced"])
            for f in block["by_file"]] == [("a.yaml", 2, 3.0, 1), ("b.yaml", 1, 1.0, 0)]
    json.dumps(block)


def test_costs_of_an_unreadable_report_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "r.json"
    bad.write_text("[" * 60000)
    assert bench_main(["--costs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err


def test_the_hang_bench_times_a_diagnosed_hang() -> None:
    """``collective-bench``'s hang figure comes from a case the loader accepts (a receive no
    send matches, declared as a hang) and a hang diagnosed with stacks, not from an error."""
    extra = bench_hang(0.5)
    assert extra >= 0.0
