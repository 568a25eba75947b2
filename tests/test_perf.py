"""Performance mode: bandwidth math, the --perf run and its report, the perf gate.

No assertion here depends on how fast anything ran: timings are only required to exist, be
positive and be consistent with each other (busbw = algbw * the bus factor).
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import ops
from harness.bench.busbw import main as busbw_main
from harness.casefile import expand, load, validate
from harness.gate import cli
from harness.gate import perf as perfgate
from harness.model import RankResult
from harness.perf import stats
from harness.perf.plan import loop_settings as perfplan_loop
from harness.program.perf import wait_order
from harness.report import html, markdown
from harness.report.records import validate_report, write_json

from .helpers import HANG_S, PYTHON, load_report, subprocess_env

pytest_plugins = ["pytester"]


# -- bandwidth math ----------------------------------------------------------------------------

# nccl-tests' doc/PERFORMANCE.md, written out independently of the op table.
NCCL_TESTS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "isend": lambda n: 1.0,
    "irecv": lambda n: 1.0,
}


@pytest.mark.parametrize("name", sorted(NCCL_TESTS))
def test_bus_factors_are_nccl_tests_formulas(name: str) -> None:
    for n in range(1, 17):
        assert ops.get(name).bus_factor(n) == pytest.approx(NCCL_TESTS[name](n)), (name, n)


def test_bandwidth_units() -> None:
    algbw, busbw = stats.bandwidth(1 << 20, 1e-3, 1.5)
    assert algbw == pytest.approx((1 << 20) / 1e-3 / 1e9)  # GB/s, 1e9 bytes per second
    assert busbw == pytest.approx(algbw * 1.5)
    with pytest.raises(ValueError):
        stats.bandwidth(8, 0.0, 1.0)


def _instance(text: str, ws: int = 4) -> Any:
    doc = load.load_text(textwrap.dedent(text), "x.yaml")
    return next(i for c in validate.load_cases(doc) for i in expand.expand(c, "gloo")
                if i.world_size == ws)


def _rank(rank: int, times: list[float], nbytes: int, iters: int = 10) -> RankResult:
    return RankResult(rank, "ok", perf={"times_s": times, "iters": iters, "warmup": 2,
                                        "bytes": nbytes})


def test_aggregate_takes_the_slowest_rank_per_repeat_and_the_median_over_repeats() -> None:
    inst = _instance("""
        cases:
          - {name: ar, op: all_reduce, world_size: 4, shape: [1024], input: "i"}
        """)
    # Repeat i's time is the max over ranks: [4, 2, 3] ms -> median 3 ms.
    results = {0: _rank(0, [1e-3, 2e-3, 3e-3], 4096), 1: _rank(1, [4e-3, 1e-3, 1e-3], 4096),
               2: _rank(2, [1e-3, 1e-3, 1e-3], 4096), 3: _rank(3, [1e-3, 1e-3, 2e-3], 4096)}
    p = stats.aggregate(inst, results)
    assert p["repeat_times_us"] == [4000.0, 2000.0, 3000.0]
    assert p["time_us"] == 3000.0 and p["time_us_min"] == 2000.0 and p["time_us_max"] == 4000.0
    assert p["spread"] == pytest.approx(2 / 3, rel=1e-4)
    assert p["algbw_gbs"] == pytest.approx(4096 / 3e-3 / 1e9, rel=1e-4)
    assert p["busbw_gbs"] == pytest.approx(p["algbw_gbs"] * 2 * 3 / 4, rel=1e-4)
    assert p["busbw_gbs_min"] < p["busbw_gbs"] < p["busbw_gbs_max"]
    assert p["form"] == "in-place" and p["count"] == 1024 and p["group_size"] == 4


def test_aggregate_refuses_what_does_not_line_up() -> None:
    inst = _instance("""
        cases:
          - {name: ag, op: all_gather_into_tensor, world_size: 2, shape: [8], input: "i"}
        """, ws=2)
    ok = {0: _rank(0, [1e-3], 64), 1: _rank(1, [1e-3], 64)}
    assert stats.aggregate(inst, ok)["form"] == "out-of-place"
    assert "line up" in stats.aggregate(inst, {0: _rank(0, [1e-3], 64),
                                               1: _rank(1, [1e-3], 64, iters=11)})["not_timed"]
    assert "every rank" in stats.aggregate(inst, {0: ok[0]})["not_timed"]
    skipped = {0: RankResult(0, "ok", perf={"not_timed": "x failed"}), 1: ok[1]}
    assert stats.aggregate(inst, skipped) == {"not_timed": "x failed"}


# -- a --perf run and its report -----------------------------------------------------------------

PERF_CASES = """
cases:
  - name: ar
    op: all_reduce
    world_size: 2
    params: {n: [16, 4096]}
    shape: [n]
    input: "rank + i % 5"
  - name: ag
    op: all_gather_into_tensor
    world_size: 2
    args: {inplace: [false, true]}
    shape: [64]
    input: "rank * 100 + i"
  - name: rs
    op: reduce_scatter_tensor
    world_size: 2
    args: {inplace: [false, true]}
    shape: [64]
    input: "rank * 3 + i"
  - name: wrong
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank"
    expected: [7, 7, 7, 7]
  - name: slow_program
    world_size: 2
    tensors:
      t: {shape: [4], init: "rank"}
    steps:
      - {sleep: 0.01}
      - {op: all_reduce, tensor: t}
    expected:
      t: [1, 1, 1, 1]
  - name: ring
    world_size: 2
    tensors:
      out: {shape: [32], init: "rank * 10 + i"}
      got: {shape: [32], init: poison}
    steps:
      - {op: isend, tensor: out, dst: "(rank + 1) % world_size", handle: s}
      - {op: irecv, tensor: got, src: "(rank - 1) % world_size", handle: r}
      - {wait: [r, s]}
    expected:
      out: unchanged
      got: "((rank - 1) % world_size) * 10 + i"
  - name: sweep_only
    op: broadcast
    world_size: 2
    marks: [perf]
    args: {src: 0}
    shape: [8]
    input: "i"
"""


@pytest.fixture(scope="module")
def perf_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("perf")
    (root / "cases").mkdir()
    (root / "cases" / "p.yaml").write_text(textwrap.dedent(PERF_CASES))
    (root / "pytest.ini").write_text("[pytest]\n")
    args = ["--perf", "--perf-warmup", "1", "--perf-iters", "2", "--perf-min-time", "0",
            "--perf-repeats", "3", "-p", "no:cacheprovider"]
    proc = subprocess.run([PYTHON, "-m", "pytest", "cases/", *args, "-q"], cwd=root,
                          capture_output=True, text=True, env=subprocess_env(), timeout=HANG_S)
    quick = subprocess.run([PYTHON, "-m", "pytest", "cases/", "-q", "--no-report",
                            "-p", "no:cacheprovider"], cwd=root, capture_output=True,
                           text=True, env=subprocess_env(), timeout=HANG_S)
    return {"root": root, "proc": proc, "quick": quick,
            "report": load_report(root / "reports" / "conformance.json")}


def test_perf_run_records_numbers_for_passing_instances(perf_run: dict[str, Any]) -> None:
    report = perf_run["report"]
    validate_report(report)  # the perf sections are in the schema
    recs = {r["case"] + "[" + r["id"] + "]": r for r in report["records"]}
    timed = [r for r in recs.values() if r["outcome"] == "passed" and "time_us" in r["perf"]]
    assert {r["case"] for r in timed} == {"ar", "ag", "rs", "ring", "sweep_only"}
    assert len(timed) == 8  # in-place forms are timed too (the documented in-place call)
    for r in timed:
        p = r["perf"]
        for k in ("time_us", "time_us_min", "time_us_max", "algbw_gbs", "bytes", "iters"):
            assert p[k] > 0, (r["key"], k)
        assert p["repeats"] == 3 and len(p["repeat_times_us"]) == 3 and p["warmup"] == 1
        assert p["time_us_min"] <= p["time_us"] <= p["time_us_max"]
        assert p["busbw_gbs"] == pytest.approx(p["algbw_gbs"] * p["bus_factor"], rel=1e-3)
        # The time is the slowest rank's: no rank's raw median is above it.
        per_rank = [sorted(x["perf"]["times_s"])[1] * 1e6 for x in r["ranks"]]
        assert max(per_rank) <= p["time_us_max"] * 1.0001
    ag = [r for r in timed if r["case"] == "ag"]
    assert sorted(r["perf"]["form"] for r in ag) == ["in-place", "out-of-place"]
    rs = [r["perf"] for r in timed if r["case"] == "rs"]
    assert sorted(p["form"] for p in rs) == ["in-place", "out-of-place"]
    assert all(p["bytes"] == 64 * 4 for p in rs)  # the full input
    assert all(r["perf"]["bytes"] == 2 * 64 * 4 for r in ag)  # the gathered buffer
    ring = next(r["perf"] for r in timed if r["case"] == "ring")
    assert ring["op"] == "isend+irecv" and ring["form"] == "out-of-place"
    assert ring["bytes"] == 32 * 4 and ring["bus_factor"] == 1.0
    ar = sorted((r for r in timed if r["case"] == "ar"), key=lambda r: r["perf"]["bytes"])
    assert [r["perf"]["bytes"] for r in ar] == [64, 16384]
    points = report["perf"]["points"]
    assert sorted(p["key"] for p in points) == sorted(r["key"] for r in timed)
    assert report["perf"]["settings"]["repeats"] == 3
    assert report["perf"]["host"]["cpu_count"] >= 1
    assert report["metadata"]["options"]["perf"]["iters"] == 2


def test_a_failing_instance_gets_no_bandwidth(perf_run: dict[str, Any]) -> None:
    report = perf_run["report"]
    wrong = next(r for r in report["records"] if r["case"] == "wrong")
    assert wrong["outcome"] == "failed"
    assert "perf" not in wrong and all("perf" not in x for x in wrong["ranks"])
    assert not any(p["key"] == wrong["key"] for p in report["perf"]["points"])
    assert "wrong values" in wrong["message"]
    slow = next(r for r in report["records"] if r["case"] == "slow_program")
    assert slow["outcome"] == "passed"
    assert slow["perf"] == {"not_timed": "the program has sleep steps"}
    assert report["perf"]["not_timed"] == 1
    assert perf_run["proc"].returncode == 1  # the failure still fails the session


def test_perf_sections_in_markdown_and_html(perf_run: dict[str, Any]) -> None:
    report = perf_run["report"]
    md = markdown.render(report)
    assert "## Bandwidth (perf mode)" in md
    assert ("| size (B) | count | type | redop | root | out-of-place time (us) | algbw (GB/s) "
            "| busbw (GB/s) | #wrong | in-place time (us) |") in md
    ar = next(p for p in report["perf"]["points"] if p["op"] == "all_reduce"
              and p["bytes"] == 16384)
    assert "| 16384 | 4096 | float32 | sum | - | - | - | - | - | " in md
    assert "1 passed instance(s) were not timed" in md
    page = html.render(report)
    section = page[page.index('<section class="perf"'):]
    assert section.count("<svg") == 5  # all_gather_into_tensor, all_reduce, broadcast,
    # reduce_scatter_tensor and the ring
    assert f"busbw {ar['busbw_gbs']} GB/s" in section
    assert "http" not in section.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_sweep_cases_run_only_with_perf(perf_run: dict[str, Any]) -> None:
    out = perf_run["quick"].stdout
    assert "1 deselected" in out, out[-500:]
    assert "sweep_only" not in out
    sweep = [r for r in perf_run["report"]["records"] if r["case"] == "sweep_only"]
    assert len(sweep) == 1 and sweep[0]["outcome"] == "passed"


def test_bundled_perf_yaml_is_deselected_without_perf(pytester: pytest.Pytester) -> None:
    root = Path(__file__).resolve().parents[1]
    (pytester.path / "perf.yaml").write_text((root / "cases" / "perf.yaml").read_text())
    result = pytester.runpytest("perf.yaml", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*no tests collected (* deselected)*"])
    result = pytester.runpytest("perf.yaml", "--collect-only", "-q", "--perf")
    result.stdout.fnmatch_lines(["*tests collected*"])
    ids = [ln for ln in result.stdout.lines if "::" in ln]
    for case in ("all_reduce_fp32", "all_gather_half", "reduce_scatter_fp32", "broadcast_half",
                 "reduce_fp32", "all_to_all_half", "sendrecv_fp32"):
        assert any(f"::{case}[" in i for i in ids), case
    assert any("bfloat16" in i for i in ids) and any("float16-" in i for i in ids)
    sizes = {int(i.split("-bytes")[1].rstrip("]")) for i in ids}
    assert min(sizes) == 8 and max(sizes) == 4 << 20
    assert all(s & (s - 1) == 0 for s in sizes)  # doubling from 8 B


# -- the perf gate ------------------------------------------------------------------------------

def _report(points: dict[str, tuple[float, float, float]]) -> dict[str, Any]:
    return {"metadata": {"backends": ["gloo"], "devices": ["cpu"], "torch": "2.x"},
            "perf": {"host": {"cpu_model": "m"}, "points": [
                {"key": k, "bytes": 1 << 20, "busbw_gbs": med, "busbw_gbs_min": lo,
                 "busbw_gbs_max": hi} for k, (med, lo, hi) in points.items()]}}


def _baseline(points: dict[str, tuple[float, float, float]],
              threshold: float = 0.1) -> perfgate.PerfBaseline:
    entries = perfgate.entries_from_report(_report(points))
    return perfgate.PerfBaseline(entries, threshold, 0, perfgate.facts_of(_report({})))


def test_gate_fails_on_a_drop_beyond_the_spread() -> None:
    base = _baseline({"a": (10.0, 9.9, 10.1)})
    res = perfgate.compare(_report({"a": (8.0, 7.9, 8.1)}), base)  # -20 %, noise 2 %
    assert not res.ok and [d.key for d in res.of("regression")] == ["a"]
    assert res.deltas[0].change == pytest.approx(-0.2)
    assert "FAIL" in perfgate.render_text(res) and "-20.0%" in perfgate.render_text(res)


def test_gate_passes_a_drop_within_the_noise() -> None:
    base = _baseline({"a": (10.0, 8.0, 12.0)})  # the repeats scatter +-20 %
    res = perfgate.compare(_report({"a": (8.0, 6.5, 9.5)}), base)  # -20 %, noise 39 %
    assert res.ok and res.of("unchanged") and not res.of("regression")
    # The same drop with quiet repeats fails: the noise, not the drop alone, decides.
    quiet = perfgate.compare(_report({"a": (8.0, 7.99, 8.01)}), _baseline({"a": (10, 9.99,
                                                                               10.01)}))
    assert not quiet.ok
    # And a small drop under the threshold passes however quiet.
    assert perfgate.compare(_report({"a": (9.5, 9.5, 9.5)}),
                            _baseline({"a": (10, 10, 10)})).ok


def test_gate_reports_improvements_missing_and_new() -> None:
    base = _baseline({"a": (10.0, 9.9, 10.1), "gone": (1.0, 1.0, 1.0)})
    res = perfgate.compare(_report({"a": (13.0, 12.9, 13.1), "fresh": (1, 1, 1)}), base)
    assert res.ok and [d.key for d in res.of("improvement")] == ["a"]
    assert res.missing == ["gone"] and res.new == ["fresh"]
    text = perfgate.render_text(res)
    assert "PASS" in text and "Improvements (1)" in text and "+30.0%" in text


def test_gate_cli_update_keeps_threshold_and_gates(perf_run: dict[str, Any], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # A real --perf report, its repeats' spread removed so that the verdicts below do not
    # depend on this machine's noise; and the same at a tenth of the bandwidth.
    paths = []
    for name, factor in (("good.json", 1.0), ("bad.json", 0.1)):
        doc = copy.deepcopy(perf_run["report"])
        for p in doc["perf"]["points"]:
            for k in ("busbw_gbs_min", "busbw_gbs_max", "busbw_gbs"):
                p[k] = p["busbw_gbs"] * factor
        paths.append(str(tmp_path / name))
        write_json(paths[-1], doc)
    good, bad = paths
    base = str(tmp_path / "perf-baseline.json")
    assert cli.main(["--perf", good, base, "--update", "--threshold", "0.25"]) == 0
    saved = json.loads(Path(base).read_text())
    assert saved["threshold"] == 0.25
    assert len(saved["points"]) == len(perf_run["report"]["perf"]["points"]) > 0
    assert cli.main(["--perf", good, base, "--update"]) == 0  # threshold kept
    assert json.loads(Path(base).read_text())["threshold"] == 0.25
    assert cli.main(["--perf", good, base]) == 0
    assert cli.main(["--perf", bad, base]) == 1
    assert "Regressions (fail)" in capsys.readouterr().out
    assert cli.main(["--perf", good, str(tmp_path / "nope.json")]) == 2
    assert "--update" in capsys.readouterr().err
    assert math.isclose(perfgate.load(base).threshold, 0.25)


def test_the_bare_loop_waits_in_the_order_of_the_case() -> None:
    """collective-bench --busbw compares the harness with a bare loop of the same program:
    the case's wait order (irecv first here), which on Gloo changes the time per call."""
    inst = _instance("""
    cases:
      - name: ring
        world_size: 2
        tensors:
          out: {shape: [4], init: "rank"}
          got: {shape: [4], init: poison}
        steps:
          - {op: isend, tensor: out, dst: "(rank + 1) % world_size", handle: s}
          - {op: irecv, tensor: got, src: "(rank - 1) % world_size", handle: r}
          - {wait: [r, s]}
        expected: {got: "(rank - 1) % world_size"}
    """, ws=2)
    assert wait_order(list(inst.steps)) == [1, 0]
    assert wait_order([s for s in inst.steps if s.kind == "op"]) == [0, 1]


def test_busbw_pairs_every_block_of_the_harness_with_one_of_the_bare_loop(
        tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(textwrap.dedent("""
    cases:
      - name: ar
        op: all_reduce
        world_size: 2
        params: {bytes: [4096]}
        shape: ["bytes // 4"]
        input: "rank + i"
      - name: ring
        world_size: 2
        params: {bytes: [4096]}
        tensors:
          out: {shape: ["bytes // 4"], init: "rank + i"}
          got: {shape: ["bytes // 4"], init: poison}
        steps:
          - {op: isend, tensor: out, dst: "(rank + 1) % world_size", handle: s}
          - {op: irecv, tensor: got, src: "(rank - 1) % world_size", handle: r}
          - {wait: [r, s]}
        expected: {got: "(rank - 1) % world_size + i"}
    """))
    out = tmp_path / "b.json"
    assert busbw_main(["--cases", str(tmp_path / "p.yaml"), "--world-sizes", "2",
                       "--min-bytes", "0", "--runs", "1", "--repeats", "3", "--iters", "4",
                       "--min-time", "0", "--warmup", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["op"] for r in rows) == ["all_reduce", "isend+irecv"]
    for r in rows:
        assert r["pairs"] == 3 and len(r["ratios"]) == 3
        assert all(math.isfinite(x) and x > 0 for x in r["ratios"])
        assert r["harness_busbw_gbs"] > 0 and r["bare_busbw_gbs"] > 0
        assert math.isfinite(r["ratio_of_means"]) and len(r["ratios_of_means"]) == 3


# -- --perf-check: checked runs after the timing loop (nccl-tests -c) -------------------------

CHECKED_CASES = """\
cases:
  - name: summed
    op: all_reduce
    world_size: 2
    dtype: float32
    shape: [64]
    input: {generator: random, seed: 3}
"""


def _perf_check_session(root: Path, fault: str, *extra: str) -> tuple[str, dict[str, Any]]:
    (root / "cases").mkdir(parents=True, exist_ok=True)
    (root / "cases" / "c.yaml").write_text(CHECKED_CASES)
    (root / "pytest.ini").write_text("[pytest]\n")
    env = {**subprocess_env(), "COLLECTIVE_MUTANT": fault}
    proc = subprocess.run([PYTHON, "-m", "pytest", "cases/", "-q", "-p", "no:cacheprovider",
                           "--backend", "mutant", "--backend-module", "harness.mutate.backend",
                           "--perf", "--perf-warmup", "1", "--perf-iters", "3",
                           "--perf-min-time", "0", "--perf-repeats", "2", *extra],
                          cwd=root, capture_output=True, text=True, env=env, timeout=600)
    report = load_report(root / "reports" / "conformance.json")
    validate_report(report)
    (rec,) = report["records"]
    return proc.stdout + proc.stderr, {**rec, "_settings": report["perf"]["settings"]}


def test_perf_check_catches_a_backend_wrong_on_later_uses(tmp_path: Path) -> None:
    """run_dependent_sum makes every second all_reduce of a group wrong: the first run's check
    passes and the timing loop checks nothing, so only the checked runs after it can see it."""
    out, unchecked = _perf_check_session(tmp_path / "a", "run_dependent_sum")
    assert unchecked["outcome"] == "passed", out
    assert "perf_check" not in (unchecked.get("numerics") or {}).get("properties", {})
    out, rec = _perf_check_session(tmp_path / "b", "run_dependent_sum", "--perf-check", "2")
    assert rec["outcome"] == "failed", out
    assert "after the timing loop" in rec["message"] and "fresh inputs" in rec["message"]
    assert "perf check 2" in rec["message"]  # names the run that was wrong
    assert rec["_settings"]["check"] == 2


def test_perf_check_passes_a_correct_backend_and_says_what_it_compared(tmp_path: Path) -> None:
    out, rec = _perf_check_session(tmp_path, "none", "--perf-check", "3")
    assert rec["outcome"] == "passed", out
    assert rec["perf"]["time_us"] > 0
    assert {"property": "perf_check", "buffers": ["tensor"], "ranks": [0, 1],
            "runs": 4} in rec["evidence"]["properties"]


def test_perf_check_bounds() -> None:
    with pytest.raises(ValueError, match="--perf-check 101"):
        perfplan_loop({"--perf-check": "101"})
    assert perfplan_loop({}).check == 0
