"""State a backend carries from one instance to the next on the shared ranks is diagnosed.

``tests/sticky_backend.py`` rejects ``reduce`` and, from that error on, gets every
``all_reduce`` wrong on the same ranks, while the pool's health check still passes. A failure
after an earlier failure or raise on the same ranks runs once more on fresh ranks: if it passes
there, its outcome stays ``failed`` and the record (``fresh_rerun``), the message and the
Markdown report say that state was carried between instances. The reruns are bounded by
``--fresh-reruns``, and a failure that fails on fresh ranks too is said to. Why a pool was
replaced is on its record and grouped on a certificate (``tests/spent_backend.py``: a group
unusable after any error).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .helpers import load_report, run_pytest, write_case_file

CASES = """
cases:
  - name: a_sum
    op: all_reduce
    world_size: 2
    shape: [2]
    input: "rank + i"
  - name: b_reduce
    op: reduce
    world_size: 2
    args: {dst: 0}
    shape: [2]
    input: "rank + i"
  - name: c_sum
    op: all_reduce
    world_size: 2
    shape: [3]
    input: "rank * i"
  - name: d_sum
    op: all_reduce
    world_size: 2
    shape: [4]
    input: "rank + 2 * i"
"""
WRONG = """
  - name: e_wrong_everywhere
    world_size: 2
    params: {n: [2, 3]}
    tensors: {t: {shape: [n], init: "rank"}}
    steps:
      - {op: all_reduce, tensor: t}
    expected: {t: 5}
"""
KEY = "c.yaml::{}[sticky-ws2-float32-sum-sync-dst0]"  # of a reduce case


def run(tmp_path: Path, text: str, *extra: str, by_key: bool = False
        ) -> tuple[dict[str, dict[str, Any]], str]:
    """The records (by case name, or by key) and the Markdown report of a session on the
    sticky backend."""
    write_case_file(tmp_path, text)
    res = run_pytest(tmp_path, "c.yaml", "-q", "-p", "no:randomly", "--backend", "sticky",
                     "--backend-module", "tests.sticky_backend", *extra)
    assert res.returncode == 1, res.stdout + res.stderr
    report = load_report(tmp_path / "reports" / "conformance.json")
    return ({r["key" if by_key else "case"]: r for r in report["records"]},
            (tmp_path / "reports" / "conformance.md").read_text())


def test_a_failure_that_passes_on_fresh_ranks_says_state_was_carried(tmp_path: Path) -> None:
    by_case, markdown = run(tmp_path, CASES)
    assert by_case["a_sum"]["outcome"] == "passed"
    assert by_case["b_reduce"]["outcome"] == "error"
    carried = by_case["c_sum"]
    assert carried["outcome"] == "failed"  # never turned into a pass
    assert carried["fresh_rerun"] == {"after": KEY.format("b_reduce"), "fresh": "passed",
                                      "state_carried": True}
    said = (f"failed only after {KEY.format('b_reduce')} on the same ranks; passes on fresh "
            "ranks: state carried between instances")
    assert said in carried["message"]
    assert "state carried between instances" in markdown and "b_reduce" in markdown
    # The suspect ranks were replaced: the next instance runs on the fresh ones.
    assert carried["pool_replaced"] is True
    assert carried["pool_replaced_why"] == ("not reused: this instance failed after an earlier "
                                            "one failed or raised on the same ranks")
    assert by_case["d_sum"]["outcome"] == "passed"
    assert "fresh_rerun" not in by_case["b_reduce"] and "fresh_rerun" not in by_case["a_sum"]


def test_a_failure_on_fresh_ranks_too_is_not_blamed_on_carried_state(tmp_path: Path) -> None:
    cases = CASES[:CASES.index("  - name: c_sum")] + WRONG.strip("\n") + "\n"
    records = run(tmp_path, cases, "--fresh-reruns", "1", by_key=True)[0]
    first = records["c.yaml::e_wrong_everywhere[sticky-ws2-float32-sum-sync-n2]"]
    assert first["outcome"] == "failed"
    assert first["fresh_rerun"] == {"after": KEY.format("b_reduce"), "fresh": "failed",
                                    "state_carried": False}
    assert (f"(run again on fresh ranks, since {KEY.format('b_reduce')} failed or raised on "
            "the same ranks before it: failed there too)") in first["message"]
    assert "state carried" not in first["message"]
    # The case's next instance spends no rerun: its first one failed on fresh ranks too.
    second = records["c.yaml::e_wrong_everywhere[sticky-ws2-float32-sum-sync-n3]"]
    assert second["outcome"] == "failed" and "fresh_rerun" not in second
    assert ("not run again on fresh ranks: c.yaml::e_wrong_everywhere[sticky-ws2-float32-sum-sync-"
            "n2], of the same case, failed there too)") in second["message"]


def test_reruns_are_bounded_per_session(tmp_path: Path) -> None:
    again = CASES.replace("  - name: d_sum", "  - name: b2_reduce\n    op: reduce\n"
                          "    world_size: 2\n    args: {dst: 0}\n    shape: [2]\n"
                          "    input: \"rank\"\n  - name: d_sum")
    by_case, _ = run(tmp_path, again, "--fresh-reruns", "1")
    assert by_case["c_sum"]["fresh_rerun"]["state_carried"] is True
    assert by_case["b2_reduce"]["outcome"] == "error"  # breaks the fresh ranks too
    d = by_case["d_sum"]
    assert d["outcome"] == "failed" and "fresh_rerun" not in d
    assert (f"failed after {KEY.format('b2_reduce')} failed or raised on the same ranks; not "
            "run again on fresh ranks: the session's 1 rerun(s) (--fresh-reruns) are spent"
            ) in d["message"]


def test_no_rerun_at_all_with_zero(tmp_path: Path) -> None:
    by_case, _ = run(tmp_path, CASES, "--fresh-reruns", "0")
    for name in ("c_sum", "d_sum"):
        rec = by_case[name]
        assert rec["outcome"] == "failed" and "fresh_rerun" not in rec
        assert "the session's 0 rerun(s) (--fresh-reruns) are spent" in rec["message"]


def test_a_group_unusable_after_an_error_is_on_record_and_on_the_certificate(
        tmp_path: Path) -> None:
    """tests/spent_backend.py raises on every call after its first error, the health check
    included: each verdict is right, and only why the pool was replaced shows the cost (a new
    process group per rejected call, as on torchft's BabyGloo)."""
    from harness.certify import cells, render

    write_case_file(tmp_path, CASES)
    res = run_pytest(tmp_path, "c.yaml", "-q", "-p", "no:randomly", "--backend", "spent",
                     "--backend-module", "tests.spent_backend")
    assert res.returncode == 1, res.stdout + res.stderr
    report = load_report(tmp_path / "reports" / "conformance.json")
    by_case = {r["case"]: r for r in report["records"]}
    rejected = by_case["b_reduce"]
    assert rejected["outcome"] == "error" and rejected["pool_replaced"] is True
    assert rejected["pool_replaced_why"].startswith("health check failed: rank ")
    assert "unusable after an earlier error" in rejected["pool_replaced_why"]
    assert by_case["c_sum"]["outcome"] == by_case["d_sum"]["outcome"] == "passed"  # new group
    assert "pool_replaced_why" not in by_case["a_sum"]  # kept: nothing to say
    cert = cells.certificate(None, report, None)
    assert [(c["count"], c["examples"]) for c in cert["pools_replaced"]] == [
        (1, [rejected["key"]])]
    assert cert["pools_replaced"][0]["why"].startswith("health check failed: rank ")
    text = render.markdown(cert)
    assert "Process groups not kept after an instance" in text
    assert "unusable after an earlier error" in text
