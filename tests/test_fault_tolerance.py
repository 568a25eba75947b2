"""Programs through a failure: planned deaths, survivors that detect them in bounded time,
recovery by re-forming the world, every rank accounted, and what cannot be written."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.fuzz import space
from harness.verdict import deaths
from tests.helpers import (
    HANG_S,
    case_error,
    case_instances,
    finish,
    load_report,
    pytest_argv,
    rank_pids,
    run_pytest,
    start,
    wait_for,
    write_case_file,
)

HEAD = """
cases:
  - name: c
    world_size: 3
    deadline: 40
    tensors:
      t: {shape: [4], init: "rank + 1"}
      u: {shape: [4], init: "rank + 1"}
"""


# An ordinary instance on the same world size, after the one through a failure.
NEXT = """
  - name: d
    op: all_reduce
    world_size: 3
    shape: [4]
    input: "rank + i"
    expected: auto
"""


def ran_next(rec: dict[str, Any]) -> None:
    """The ordinary instance after a failure passed, and ran: every rank computed and the
    sum was checked (not lost with the pool the failure left behind)."""
    assert rec["case"] == "d" and rec["outcome"] == "passed", rec["message"]
    assert [r["status"] for r in rec["ranks"]] == ["ok"] * 3
    assert rec["evidence"]["checks"], rec["evidence"]


@pytest.mark.parametrize("steps, where, words", [
    ("      - {exit: 1}\n      - {op: all_reduce, tensor: t, raises: x}\n", "x.yaml:10:9",
     "every rank of the world of 3 dies"),
    ("      - {kill: true, ranks: [1]}\n"
     "      - {op: all_reduce, tensor: t, ranks: [0, 1], raises: x}\n", "x.yaml:11:9",
     "rank 1 died at step 0 (kill) and cannot run step 1"),
    ("      - {exit: 2, ranks: [1]}\n      - {reform: [0, 1]}\n", "x.yaml:11:18",
     "names rank 1, dead since step 0"),
    ("      - {op: all_reduce, tensor: t, raises: {match: x, within: 0}}\n", "x.yaml:10:64",
     "0 is less than or equal to the minimum of 0"),
    ("      - {op: all_reduce, tensor: t, raises: {match: x, not_before: 2, within: 1}}\n",
     "x.yaml:10:79", "within 1 is not after not_before 2"),
    ("      - {reform: everyone}\n", "x.yaml:10:18", "is not a list of ranks"),
    ("      - {shrink: [5]}\n", "x.yaml:10:18", "shrink names rank 5, outside world_size 3"),
    ("      - {reform: [0, 0]}\n", "x.yaml:10:18", "reform names a rank twice"),
    # A bound must be a positive, finite number of seconds: YAML spells NaN and the
    # infinities .nan and .inf, which no range check in the schema catches alone.
    ("      - {op: all_reduce, tensor: t, raises: {match: x, within: .nan}}\n",
     "x.yaml:10:64", "within must be a positive, finite number of seconds, got nan"),
    ("      - {op: all_reduce, tensor: t, raises: {match: x, within: .inf}}\n",
     "x.yaml:10:64", "inf is greater than the maximum of 3600"),
    ("      - {op: all_reduce, tensor: t, raises: {match: x, within: -1}}\n", "x.yaml:10:64",
     "-1 is less than or equal to the minimum of 0"),
    ("      - {op: all_reduce, tensor: t, raises: {match: x, within: -.inf}}\n",
     "x.yaml:10:64", "-inf is less than or equal to the minimum of 0"),
    ("      - {op: all_reduce, tensor: t, raises: {match: x, not_before: .nan}}\n",
     "x.yaml:10:68", "not_before must be a positive, finite number of seconds, got nan"),
    ("      - {op: all_reduce, tensor: t, raises: {match: x, not_before: -2}}\n",
     "x.yaml:10:68", "-2 is less than or equal to the minimum of 0"),
    ("      - {set_timeout: .nan}\n", "x.yaml:10:23",
     "set_timeout must be a positive, finite number of seconds, got nan"),
    ("      - {set_timeout: .inf}\n", "x.yaml:10:23", "inf is greater than the maximum of 3600"),
    ("      - {set_timeout: -3}\n", "x.yaml:10:23", "-3 is less than or equal to the minimum"),
])
def test_what_cannot_run_through_a_failure_is_an_error_at_its_line(
        steps: str, where: str, words: str) -> None:
    text = HEAD + "    steps:\n" + steps + "    expected: {}\n"
    err = case_error(text)
    assert f"cases/{where}" in err and words in err, err
    assert err.count(f"cases/{where}") == 1, err  # one mistake, said once


def test_a_planned_death_plans_the_survivors() -> None:
    inst = case_instances(HEAD + """    steps:
      - {exit: 3, ranks: [1]}
      - {op: all_reduce, tensor: t, raises: {match: reset, within: 5}}
      - {reform: survivors}
      - {op: all_reduce, tensor: u}
    unchecked: {t: failed}
    expected: {u: {0: 4, 2: 4}}
""")[0]
    assert inst.deaths == ((1, 0, "exit 3"),) and inst.isolate
    reform = inst.steps[2]
    assert reform.value == (0, 2) and reform.ranks == (0, 2)  # survivors made concrete
    assert inst.steps[1].raises_within == 5.0


def test_survivors_detect_recover_and_every_rank_is_accounted(tmp_path: Path) -> None:
    # pg_timeout: Gloo's ring survivor that only sends to the dead rank may learn of it only
    # at the group's timeout (docs/reference/programs.md).
    write_case_file(tmp_path, HEAD + """    pg_timeout: 5
    steps:
      - {exit: 3, ranks: [1]}
      - {op: all_reduce, tensor: t,
         raises: {match: "[Rr]eset|[Cc]losed|[Pp]eer|[Tt]imed out", within: 10}}
      - {reform: survivors}
      - {op: all_reduce, tensor: u}
    unchecked: {t: a failed all_reduce}
    expected: {u: 4}
""" + NEXT)
    proc = run_pytest(tmp_path, "c.yaml", "-q", "-p", "no:randomly")
    rec, after = load_report(tmp_path / "reports" / "conformance.json")["records"]
    assert rec["outcome"] == "passed", proc.stdout
    ran_next(after)
    # The session's detection figures, from the record's own times (two survivors).
    times = sorted(s["errors"][0]["after_s"] for s in rec["survivors"])
    line = (f"peer deaths detected after median {(times[0] + times[1]) / 2:.3g} s, max "
            f"{times[1]:.3g} s (2 detections in 1 instance through a failure)")
    assert f"collective-harness: {line}\n" in proc.stdout
    assert f"\n{line[0].upper()}{line[1:]}.\n" in (
        tmp_path / "reports" / "conformance.md").read_text()
    assert rec["deaths"] == [{"rank": 1, "step": 0, "how": "exit 3", "by_design": True,
                              "observed": "exit code 3"}]
    assert [s["rank"] for s in rec["survivors"]] == [0, 2]
    for s in rec["survivors"]:
        assert s["answered"] and s["errors"][0]["step"] == 1
        assert 0 <= s["errors"][0]["after_s"] <= 10 and s["errors"][0]["within_s"] == 10
    assert "detected after" in rec["message"] and "bound 10 s" in rec["message"]
    assert rec["evidence"]["deaths"] == ["rank 1 exit code 3 at step 0 (exit 3), as planned"]
    assert {"what": "u", "how": "explicit", "ranks": [0, 2], "elements": 8} in \
        rec["evidence"]["checks"]


def test_detection_figures_come_from_the_records_alone() -> None:
    def rec(*after: Any) -> dict[str, Any]:
        return {"survivors": [{"rank": 0, "answered": True, "errors": [
            {"step": 1, "after_s": a, "raised": "RuntimeError: reset"} for a in after]}]}
    unraised = {"survivors": [{"errors": [{"step": 1, "after_s": 50.0, "raised": ""}]}]}
    hostile = [{"survivors": "x"}, {"survivors": [{"errors": [{"after_s": "1", "raised": "y"},
                                                             {"after_s": float("nan"),
                                                              "raised": "y"}, 7]}, None]}]
    assert deaths.detection_line([rec(0.5, 0.01), rec(2.0), unraised, {"outcome": "passed"},
                                  *hostile]) == (
        "peer deaths detected after median 0.5 s, max 2 s (3 detections in 2 instances "
        "through a failure)")
    assert deaths.detection_line([rec(0.25)]).endswith("(1 detection in 1 instance through "
                                                       "a failure)")
    assert deaths.detection_line([unraised, {"key": "no deaths"}]) == ""


def test_a_survivor_past_its_bound_is_a_hang_naming_the_step(tmp_path: Path) -> None:
    write_case_file(tmp_path, HEAD.replace("deadline: 40", "deadline: 600") + """    steps:
      - {stall: true, ranks: [1]}
      - {op: all_reduce, tensor: t, raises: {match: x, within: 1}}
    unchecked: {t: a failed all_reduce}
    expected: {}
""")
    run_pytest(tmp_path, "c.yaml", "-q")
    rec = load_report(tmp_path / "reports" / "conformance.json")["records"][0]
    assert rec["outcome"] == "hang"
    assert "rank 0 still in step 1 (all_reduce(tensor=t))" in rec["message"]
    assert "past its bound of 1 s" in rec["message"]
    # The wait ended at the bound, not at the 600 s deadline.
    assert "deadline" not in rec["message"].splitlines()[0]


def test_a_planned_death_that_does_not_happen_is_said(tmp_path: Path) -> None:
    write_case_file(tmp_path, HEAD.replace("deadline: 40", "deadline: 4") + """    steps:
      - {op: recv, tensor: t, src: 2, ranks: [1]}
      - {exit: 3, ranks: [1]}
      - {reform: survivors}
      - {op: all_reduce, tensor: u}
    unchecked: {t: never}
    expected: {u: 4}
""")
    run_pytest(tmp_path, "c.yaml", "-q")
    rec = load_report(tmp_path / "reports" / "conformance.json")["records"][0]
    # Rank 1 never reached its exit: its recv failed when the survivors left the old world.
    assert rec["outcome"] == "error"
    death = rec["deaths"][0]
    assert death["rank"] == 1 and death["observed"] == "raised"
    assert "rank 1 was to die at step 1 (exit 3) but raised" in rec["message"]


def kill_at_note(tmp_path: Path, argv: list[str], rank: int, *notes: str,
                 wait_ranks: bool = False) -> tuple[str, str, list[dict[str, Any]]]:
    """Run pytest on ``argv``, SIGKILL ``rank`` once the harness's progress note (printed after
    5 s) shows one of ``notes``, and return the note, pytest's output and the report's records.

    With ``wait_ranks`` pytest must end on its own and no rank may outlive it (none is killed
    on its behalf); otherwise the session is finished within the hang bound."""
    marker = f"marker-{uuid.uuid4().hex}"
    proc = start(tmp_path, argv, merge_stderr=True, COLLECTIVE_TEST_MARKER=marker)
    note = out = ""
    try:
        assert proc.stdout is not None
        note = next((ln for ln in proc.stdout if any(n in ln for n in notes)), "")
        assert note, "the session ended without a progress note"
        os.kill(rank_pids(marker, rank)[0], signal.SIGKILL)
        if wait_ranks:
            out = note + proc.communicate(timeout=HANG_S)[0]
            wait_for(lambda: not rank_pids(marker), HANG_S, "every rank to exit with pytest")
    finally:
        if wait_ranks:
            finish(proc, 30)
        else:
            out = note + finish(proc, HANG_S).stdout
    return note, out, load_report(tmp_path / "reports" / "conformance.json")["records"]


def test_a_death_nobody_planned_is_a_crash_and_the_next_instance_runs(tmp_path: Path) -> None:
    write_case_file(tmp_path, HEAD.replace("deadline: 40", "deadline: 300") + """    steps:
      - {exit: 3, ranks: [1]}
      - {op: all_reduce, tensor: t, raises: {match: "[Rr]eset|[Cc]losed|[Pp]eer", within: 250}}
      - {sleep: 60, ranks: [2]}
    unchecked: {t: a failed all_reduce}
    expected: {}
""" + NEXT + "    isolate: true\n")
    # Instances run grouped by pool, the shared pool's first: in turn (--ahead 0), an isolated
    # 'd' is the one that comes after, and while 'c' runs its ranks are the only ones. Rank 2,
    # in its sleep, dies where no step plans it.
    _, out, (rec, after) = kill_at_note(
        tmp_path, pytest_argv("c.yaml", "-q", "-p", "no:randomly", "--ahead", "0"), 2,
        "rank 2 in step 2")
    assert rec["outcome"] == "crash", out
    assert "rank(s) 2 died undeclared" in rec["message"]
    assert "rank(s) 1 died as planned" in rec["message"]
    planned, undeclared = rec["deaths"]
    assert planned == {"rank": 1, "step": 0, "how": "exit 3", "by_design": True,
                       "observed": "exit code 3"}
    assert undeclared["rank"] == 2 and undeclared["by_design"] is False
    assert undeclared["how"] == "undeclared" and undeclared["step"] == 2
    assert undeclared["observed"] == "killed by SIGKILL in step 2 (sleep(60))"
    assert [s["rank"] for s in rec["survivors"]] == [0]  # the dead are no survivors
    ran_next(after)


def test_a_planned_death_that_comes_early_is_a_crash_not_the_plan(tmp_path: Path) -> None:
    write_case_file(tmp_path, HEAD.replace("deadline: 40", "deadline: 300") + """    steps:
      - {sleep: 60, ranks: [1]}
      - {exit: 3, ranks: [1]}
      - {op: all_reduce, tensor: t, raises: {match: "[Rr]eset|[Cc]losed|[Pp]eer", within: 250}}
    unchecked: {t: a failed all_reduce}
    expected: {}
""")
    # Killed in its sleep, rank 1 dies before its planned exit.
    _, out, (rec,) = kill_at_note(tmp_path, pytest_argv("c.yaml", "-q", "--ahead", "0"), 1,
                                  "rank 1 in step 0")
    assert rec["outcome"] == "crash", out
    assert "rank 1 was to die at step 1 (exit 3) but died first in step 0" in rec["message"]
    (death,) = rec["deaths"]  # not listed as the planned exit: it never came
    assert {k: death[k] for k in ("rank", "step", "how", "by_design")} == {
        "rank": 1, "step": 0, "how": "undeclared", "by_design": False}
    assert death["observed"] == "killed by SIGKILL in step 0 (sleep(60))"
    assert [s["rank"] for s in rec["survivors"]] == [0, 2]


def test_a_rank_killed_while_building_its_buffers_leaves_nothing_running(
        tmp_path: Path) -> None:
    # Three 64 MiB buffers per rank, each element from an expression: seconds of building.
    big = {"shape": [16 << 20], "init": "rank * 3 + i % 7"}
    text = HEAD.replace("deadline: 40", "deadline: 300").replace(
        "      u: ", "".join(f"      b{k}: {big}\n" for k in range(3)) + "      u: ")
    write_case_file(tmp_path, text + """    steps:
      - {exit: 3, ranks: [1]}
      - {op: all_reduce, tensor: t, raises: {match: "[Rr]eset|[Cc]losed|[Pp]eer", within: 250}}
      - {sleep: 60, ranks: [2]}
    unchecked: {t: a failed all_reduce, b0: never, b1: never, b2: never, u: never}
    expected: {}
""")
    # Killed building its buffers or (a machine faster than this one) in its sleep; pytest
    # is then gone, and no rank of it may outlive it.
    note, out, (rec,) = kill_at_note(
        tmp_path, pytest_argv("c.yaml", "-q", "--ahead", "0"), 2, "rank 2 building buffers",
        "rank 2 in step", wait_ranks=True)
    assert rec["outcome"] == "crash", out
    assert "rank(s) 2 died undeclared" in rec["message"]
    undeclared = [d for d in rec["deaths"] if not d["by_design"]]
    assert [d["rank"] for d in undeclared] == [2]
    where = ("while building buffers" if "rank 2 building buffers" in note else "in step")
    assert undeclared[0]["observed"].startswith(f"killed by SIGKILL {where}"), undeclared
    assert (tmp_path / "reports" / "conformance.md").exists()
    assert 2 not in [s["rank"] for s in rec["survivors"]]


def test_a_crash_case_keeps_its_meaning() -> None:
    declared, documented = case_instances("""
cases:
  - name: c
    world_size: 2
    crashes: true
    tensors: {t: {shape: [2], init: 0}}
    steps:
      - {segfault: true}
    expected: {}
  - name: d
    world_size: 2
    tensors: {t: {shape: [2], init: 0}}
    steps:
      - {segfault: true, ranks: [0]}
      - {op: all_reduce, tensor: t}
    expected: {t: 0}
""")
    # Nothing asked of the survivors after the fault: how a crash is reported, not planned.
    assert declared.deaths == () and documented.deaths == ()


def test_no_rank_outlives_pytest_killed_during_a_failure(tmp_path: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    write_case_file(tmp_path, HEAD.replace("deadline: 40", "deadline: 300") + """    steps:
      - {kill: true, ranks: [1]}
      - {stall: true, ranks: [2]}
      - {op: recv, tensor: t, src: 2, ranks: [0], raises: {match: never, within: 250}}
    unchecked: {t: never}
    expected: {}
""")
    proc = start(tmp_path, pytest_argv("c.yaml", "-q", "--no-report"), merge_stderr=True,
                 COLLECTIVE_TEST_MARKER=marker)
    try:
        wait_for(lambda: len(rank_pids(marker)) == 2, HANG_S, "the rank killed by design to die")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=HANG_S)
        wait_for(lambda: not rank_pids(marker), HANG_S, "the survivors to exit after SIGKILL")
    finally:
        if proc.poll() is None:
            finish(proc, 30)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_fuzzer_draws_valid_programs_through_a_failure(data: st.DataObject) -> None:
    ws = data.draw(st.integers(2, 6))
    case = data.draw(space.peer_death(ws))
    inst = case_instances(yaml.safe_dump({"cases": [case]}))[0]
    assert inst.deaths and len(inst.deaths) < inst.world_size
    assert space.program_op(case) == "peer_death"
