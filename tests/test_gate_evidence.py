"""Issue 22, point 2: the gate checks the evidence (the records), not the report's claims.

Each test edits a real report the way a forged, hand-edited or half-written one would differ,
and checks that ``collective-gate`` fails naming the cause. The baseline is the real report's
own, so nothing but the edit can fail the gate."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.gate import cli, evidence
from harness.report.records import build_report, write_json
from tests.runs import Run

Gate = Callable[[dict[str, Any]], tuple[int, str]]


@pytest.fixture
def real(gloo_run: Run) -> dict[str, Any]:
    return dict(json.loads(gloo_run.json.read_text()))


@pytest.fixture
def gate(gloo_run: Run, gloo_baseline: Path, tmp_path: Path,
         capsys: pytest.CaptureFixture[str]) -> Gate:
    """Write a report as given (schema-valid) and gate it against the real run's baseline."""
    def run(doc: dict[str, Any]) -> tuple[int, str]:
        path = tmp_path / "report.json"
        write_json(str(path), doc)
        capsys.readouterr()
        code = cli.main([str(path), str(gloo_baseline)])
        out = capsys.readouterr()
        return code, out.out + out.err
    return run


def rebuilt(doc: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` with these records and a summary recomputed from them (a consistent forgery)."""
    return build_report(records, doc["metadata"], doc.get("session"))


def test_the_real_report_passes(real: dict[str, Any], gate: Gate) -> None:
    assert evidence.problems(real) == []
    code, out = gate(real)
    assert code == 0 and out.startswith("collective-gate: PASS"), out


def test_no_session_block_fails(real: dict[str, Any], gate: Gate) -> None:
    del real["session"]
    code, out = gate(real)
    assert code == 1
    assert out.startswith("collective-gate: FAIL: evidence")
    assert "FAIL: the report has no session block" in out


def test_incomplete_session_fails(real: dict[str, Any], gate: Gate) -> None:
    session = real["session"]
    session.update(complete=False, collected=session["collected"] + 2, without_result=2,
                   ended_by="interrupted")
    code, out = gate(rebuilt(real, real["records"]))
    assert code == 1
    assert "FAIL: the session was incomplete: 2 of 13 collected instance(s)" in out
    assert "evidence" not in out.splitlines()[0]  # consistent: only incompleteness fails


def test_fewer_records_than_the_session_collected_fails(real: dict[str, Any],
                                                        gate: Gate) -> None:
    passed = [r for r in real["records"] if r["outcome"] == "passed"]
    doc = rebuilt(real, [r for r in real["records"] if r is not passed[0]])
    code, out = gate(doc)
    assert code == 1
    assert ("the session block states 11 collected instance(s), 0 without a result, so 11 "
            "record(s); the report holds 10") in out


def test_more_records_than_the_session_collected_fails(real: dict[str, Any],
                                                       gate: Gate) -> None:
    extra = copy.deepcopy(real["records"][0])
    extra["key"] += "-added"
    extra["axes"]["added"] = True
    code, out = gate(rebuilt(real, [*real["records"], extra]))
    assert code == 1 and "the report holds 12" in out


def test_session_block_that_contradicts_itself_fails(real: dict[str, Any], gate: Gate) -> None:
    real["session"]["without_result"] = 1
    real["session"]["collected"] += 1  # the count agrees; "complete: true" does not
    code, out = gate(rebuilt(real, real["records"]))
    assert code == 1
    assert "the session block contradicts itself: complete is True with 1 instance(s)" in out


def test_forged_summary_counts_fail(real: dict[str, Any], gate: Gate) -> None:
    rec = next(r for r in real["records"] if r["outcome"] == "passed")
    rec["outcome"] = "failed"  # the summary still says every one passed: PASS
    code, out = gate(real)
    assert code == 1
    assert ("the summary does not agree with the records (a forged or hand-edited summary): "
            "passed: states 9, records 8; failed: states 0, records 1") in out
    assert "the summary's verdict is PASS but the records give FAIL" in out
    assert "the summary says ok but the records give FAIL" in out


def test_forged_summary_verdict_fails(real: dict[str, Any], gate: Gate) -> None:
    real["summary"]["failed"] = 1  # counts edited one way, the records say another
    code, out = gate(real)
    assert code == 1 and "failed: states 1, records 0" in out


def test_duplicate_record_key_fails(real: dict[str, Any], gate: Gate) -> None:
    twin = copy.deepcopy(real["records"][0])
    twin["axes"]["twin"] = True  # a different instance to the baseline, the same key
    real["session"]["collected"] += 1
    code, out = gate(rebuilt(real, [*real["records"], twin]))
    assert code == 1
    assert f"2 records share a key with another record, so one would hide the other " \
           f"({twin['key']}, {twin['key']})" in out


def test_duplicate_json_key_hides_records_and_is_refused(gloo_run: Run, gloo_baseline: Path,
                                                         tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    text = gloo_run.json.read_text()
    head, records = text.split('\n "records": [', 1)
    forged = tmp_path / "dup.json"  # an empty records list, then the real one: json keeps one
    forged.write_text(head + '\n "records": [],\n "records": [' + records)
    assert cli.main([str(forged), str(gloo_baseline)]) == 2
    err = capsys.readouterr().err
    assert f"{forged}: the key 'records' appears twice in one object" in err


def test_unknown_or_missing_outcome_fails(real: dict[str, Any], gloo_baseline: Path,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # A report read from a file meets the schema first: named at the record's field.
    for change in ({"outcome": "great"}, {"outcome": None}):
        doc = copy.deepcopy(real)
        doc["records"][3].update(change)
        if change["outcome"] is None:
            del doc["records"][3]["outcome"]
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(doc))
        assert cli.main([str(path), str(gloo_baseline)]) == 2
        err = capsys.readouterr().err
        assert f"{path}: not a collective-harness report: at records/3" in err
    # The check itself, for a report that did not come through the schema.
    doc = copy.deepcopy(real)
    doc["records"][3]["outcome"] = "great"
    del doc["records"][4]["outcome"]
    (msg,) = [p for p in evidence.problems(doc) if "outcome" in p and "lack" in p]
    assert msg.startswith("2 record(s) lack an outcome or have an unknown one (")
    assert doc["records"][3]["key"] in msg and doc["records"][4]["key"] in msg


def test_update_refuses_a_report_that_contradicts_itself(real: dict[str, Any], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    del real["session"]
    path, base = tmp_path / "r.json", tmp_path / "b.json"
    write_json(str(path), real)
    assert cli.main([str(path), str(base), "--update"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: not written to {base}: the report has no session block" in err
    assert not base.exists()
