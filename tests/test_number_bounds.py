"""Every number option and field bounded and finite, checked before anything runs (issue 22,
points 6 and 7): the repro of each input that used to pass, hang or trace back."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench.busbw import main as busbw_main
from harness.bench.overhead import main as bench_main
from harness.mutate.cli import main as mutate_main

from .helpers import case_error, load_report, run_pytest, write_case_file

ONE = """
cases:
  - name: ar
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + i"
"""


@pytest.mark.parametrize(("args", "says"), [
    (["--perf", "--perf-min-time", "nan"], "--perf-min-time nan: must be a finite number"),
    (["--perf", "--perf-min-time", "inf"], "--perf-min-time inf: must be a finite number"),
    (["--perf", "--perf-iters", "0"], "--perf-iters 0: must be a finite number from 1"),
    (["--launched-world-size", "0"], "--launched-world-size: 0 is outside 1..1000000"),
    (["--max-pools", "0"], "--max-pools: 0 is outside 1..64"),
    (["--ahead", "-1"], "--ahead: -1 is outside 0..64"),
])
def test_a_pytest_option_out_of_bounds_is_a_usage_error(tmp_path: Path, args: list[str],
                                                        says: str) -> None:
    write_case_file(tmp_path, ONE)
    res = run_pytest(tmp_path, "c.yaml", "-q", *args)
    assert res.returncode == pytest.ExitCode.USAGE_ERROR, res.stdout + res.stderr
    assert says in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(("main", "argv", "says"), [
    (busbw_main, ["--runs", "0"], "argument --runs: 0 is outside 1..1,000"),
    (busbw_main, ["--min-time", "nan"], "argument --min-time: nan is not a finite number"),
    (bench_main, ["--instances", "0"], "argument --instances: 0 is outside"),
    (bench_main, ["--hang-deadline", "inf"], "argument --hang-deadline: inf is not a finite"),
    (mutate_main, ["-j", "-1"], "argument -j/--jobs: -1 is outside 1..64"),
    (mutate_main, ["--deadline", "nan"], "argument --deadline: nan is not a finite number"),
])
def test_a_command_option_out_of_bounds_is_one_line(main, argv, says, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_an_empty_fault_list_is_not_every_fault(capsys) -> None:  # type: ignore[no-untyped-def]
    assert mutate_main(["--faults", ""]) == 2
    assert "--faults names no fault" in capsys.readouterr().err


@pytest.mark.parametrize(("fields", "says"), [
    ("pg_timeout: .nan", "5:17: at cases[0].pg_timeout: pg_timeout must be a finite number"),
    ("deadline: .nan", "at cases[0].deadline: deadline must be a finite number"),
])
def test_a_non_finite_case_field_is_a_collection_error(fields: str, says: str) -> None:
    msg = case_error(f"""
    cases:
      - name: c
        op: all_reduce
        {fields}
        world_size: 2
        shape: [2]
        input: "i"
    """)
    assert says in msg, msg


def test_a_huge_entry_count_is_refused_before_anything_is_built() -> None:
    msg = case_error("""
    cases:
      - name: c
        world_size: 2
        tensors:
          t: {entries: 1000000000000, entry_shape: [1], init: 0}
        steps:
          - {op: all_gather, input: t, output: t}
        expected: {t: 0}
    """)
    assert "entries 1,000,000,000,000 is more than the 65,536 one list buffer may have" in msg


@pytest.mark.parametrize(("step", "says"), [
    ('{new_group: g, members: ["rank", "1 // (rank - rank)"]}',
     "members[1]: bad expression '1 // (rank - rank)' at world_size 2, rank 0: division by zero"),
    ('{new_group: g, members: ["rank", "rank + 5"]}',
     "members: on rank 0, members names rank 5, outside world_size 2"),
    ("{new_group: g, members: [0, 0, 1]}", "members names rank 0 twice"),
    ("{new_group: g, subgroups: [[0, 0]]}", "subgroups names rank 0 twice"),
    ("{new_group: g, split: [[0, 9]]}", "split names rank 9, outside world_size 2"),
    ("{new_group: g, subgroups: 5}", "group size 5 is outside 1..2"),
])
def test_group_membership_is_evaluated_at_collection(step: str, says: str) -> None:
    msg = case_error(f"""
    cases:
      - name: g
        world_size: 2
        tensors: {{t: {{shape: [1], init: rank}}}}
        steps:
          - {step}
        expected: {{}}
    """)
    assert says in msg and "cases/x.yaml:7:" in msg, msg


def test_a_membership_the_case_expects_torch_to_reject_reaches_torch() -> None:
    """Upstream's tests of torch's own checks (cases/groups.yaml) still collect and run."""
    from .helpers import case_instances

    (inst,) = case_instances("""
    cases:
      - name: g
        world_size: 2
        steps:
          - {new_group: g, subgroups: 100}
        expected: {}
        raises: "must not exceed"
    """)
    assert inst.expectation.kind == "raises"


def test_the_timing_loop_has_its_own_budget_and_never_changes_a_verdict(tmp_path: Path) -> None:
    """Point 7: --perf-iters 1000000000 used to turn a passing instance into [HANG]."""
    write_case_file(tmp_path, ONE)
    res = run_pytest(tmp_path, "c.yaml", "-q", "--perf", "--perf-iters", "1000000000",
                     "--perf-min-time", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    (rec,) = load_report(tmp_path / "reports" / "conformance.json")["records"]
    assert rec["outcome"] == "passed"
    assert rec["perf"]["not_timed"].startswith("timing budget: 5 blocks of 100,000 iterations")
