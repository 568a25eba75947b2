"""Issue 22, point 3 (and point 5's part for the gate): every command that reads a report or a
baseline reads hostile files cleanly, prints report text inert, and refuses unusable outputs.

One table: each reading command and each hostile file gives exit 2 and exactly one line on stderr
naming the file, never a traceback."""

from __future__ import annotations

import copy
import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.bench import busbw as busbw_bench
from harness.bench import overhead as bench
from harness.gate import cli, versions
from harness.gate import perf as perfgate
from harness.mutate import cli as mutate_cli
from harness.report.jsonfile import printable
from harness.report.records import build_report, write_json
from tests.runs import Run

# -- the hostile files ---------------------------------------------------------------------------


def _report_with(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], Any]:
    def make(report: dict[str, Any]) -> Any:
        doc = copy.deepcopy(report)
        change(doc)
        return doc
    return make


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        where: Any = doc
        *head, last = path.split(".")
        for part in head:
            where = where[int(part)] if isinstance(where, list) else where[part]
        if isinstance(where, list):
            where[int(last)] = value
        else:
            where[last] = value
    return change


# name -> file content: bytes, a JSON document built from a real report, a directory (None) or
# nothing at all ("missing").
HOSTILE: dict[str, Any] = {
    "deep-nesting": b"[" * 60_000,
    "deep-but-parsable": ("[" * 500 + "]" * 500).encode(),
    "utf16-bom": '{"schema_version": 1}'.encode("utf-16"),
    "latin1": b'{"a": "caf\xe9"}',
    "truncated-gzip": "gzip",
    "directory": None,
    "missing": "missing",
    "duplicate-key": b'{"schema_version": 1, "records": [], "records": []}',
    "huge-integer": b'{"a": ' + b"9" * 5000 + b"}",
    "records-5": _report_with(_set("records", 5)),
    "records-[1]": _report_with(_set("records", [1])),
    "outcome-7": _report_with(_set("records.0.outcome", 7)),
    "summary-[]": _report_with(_set("summary", [])),
    "baseline-entries-5": {"baseline_version": 1, "entries": 5},
    "baseline-entries-[1]": {"baseline_version": 1, "entries": [1]},
    "baseline-outcome-7": {"baseline_version": 1, "entries": [
        {"key": "k", "case": "c", "backend": "gloo", "axes": {}, "outcome": 7}]},
    "baseline-key-list": {"baseline_version": 1, "entries": [
        {"key": ["k"], "case": "c", "backend": "gloo", "axes": {}, "outcome": "passed"}]},
    "baseline-policy-[]": {"baseline_version": 1, "policy": [], "entries": []},
    "perf-points-5": {"kind": perfgate.KIND, "points": 5},
    "perf-nan-busbw": {"kind": perfgate.KIND, "points": [
        {"key": "k", "bytes": 8, "busbw_gbs": float("nan"), "busbw_gbs_min": 1,
         "busbw_gbs_max": 1}]},
    "perf-facts-[]": {"kind": perfgate.KIND, "facts": [], "points": []},
    "perf-min-bytes-str": {"kind": perfgate.KIND, "min_bytes": "x", "points": []},
}


def make_hostile(name: str, where: Path, report: dict[str, Any]) -> Path:
    """The hostile file ``name`` under ``where`` (its path; absent for "missing")."""
    spec = HOSTILE[name]
    path = where / f"{name}.json"
    if spec is None:
        path.mkdir()
    elif spec == "missing":
        pass
    elif spec == "gzip":
        path = where / f"{name}.json.gz"
        data = gzip.compress(json.dumps(report).encode())
        path.write_bytes(data[: len(data) // 2])
    elif isinstance(spec, bytes):
        path.write_bytes(spec)
    else:
        doc = spec(report) if callable(spec) else spec
        path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def good(gloo_run: Run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real report, its baseline and a perf baseline, to pair with each hostile file."""
    where = tmp_path_factory.mktemp("good")
    base = where / "base.json"
    assert cli.main([str(gloo_run.json), str(base), "--update"]) == 0
    perf = where / "perf.json"
    perfgate.write(str(perf), perfgate.PerfBaseline({}))
    return {"report": gloo_run.json, "baseline": base, "perf": perf}


# command name -> argv given (good files, the hostile path)
COMMANDS: dict[str, Callable[[dict[str, Path], str, Path], int]] = {
    "gate-report": lambda g, bad, tmp: cli.main([bad, str(g["baseline"])]),
    "gate-baseline": lambda g, bad, tmp: cli.main([str(g["report"]), bad]),
    "gate-update-report": lambda g, bad, tmp: cli.main([bad, str(tmp / "new.json"),
                                                         "--update"]),
    "gate-update-previous": lambda g, bad, tmp: cli.main([str(g["report"]), bad, "--update"]),
    "gate-perf-report": lambda g, bad, tmp: cli.main(["--perf", bad, str(g["perf"])]),
    "gate-perf-baseline": lambda g, bad, tmp: cli.main(["--perf", str(g["report"]), bad]),
    "versions-first": lambda g, bad, tmp: versions.main([bad, str(g["report"])]),
    "versions-second": lambda g, bad, tmp: versions.main([str(g["report"]), bad]),
    "bench-busbw-cases": lambda g, bad, tmp: busbw_bench.main(["--cases", bad]),
}
# Files that the command would take as valid input (not hostile to it): skipped from the table.
VALID_FOR = {"gate-update-previous": {"missing"}}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_reading_command_refuses_hostile_files_in_one_line(
        command: str, name: str, good: dict[str, Path], gloo_run: Run, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    if name in VALID_FOR.get(command, set()):
        return  # --update creates a baseline that does not exist yet: covered in test_gate
    report = json.loads(gloo_run.json.read_text())
    bad = make_hostile(name, tmp_path, report)
    capsys.readouterr()
    code = COMMANDS[command](good, str(bad), tmp_path)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err  # one line
    assert str(bad) in err, err  # naming the file
    assert not list(tmp_path.glob(".tmp-*")) and not (tmp_path / "new.json").exists()


# -- strings from a report are printed inert ----------------------------------------------------

FORGED = "\n✅ PASS\x1b[2J\u202e"


def forged_report(report: dict[str, Any], rename: bool) -> dict[str, Any]:
    """``report`` with one record failing with a message and op (and with ``rename``, under a
    key and backend) that try to forge lines."""
    doc = copy.deepcopy(report)
    rec = next(r for r in doc["records"] if r["outcome"] == "passed")
    if rename:
        rec["key"] += FORGED
        rec["backend"] += FORGED
    rec["outcome"] = "failed"
    rec["message"] = f"boom{FORGED}"
    rec["op"] = f"all_reduce{FORGED}"
    return build_report(doc["records"], doc["metadata"], doc["session"])  # a consistent summary


def assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\u202e" not in text
    assert not any(line.lstrip(" #>-*").startswith("✅ PASS") for line in text.splitlines())
    assert "\\x1b[2J" in text  # shown, escaped


def test_gate_prints_report_strings_inert(good: dict[str, Path], gloo_run: Run,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "forged.json"
    write_json(str(path), forged_report(json.loads(gloo_run.json.read_text()), True))
    md = tmp_path / "gate.md"
    code = cli.main([str(path), str(good["baseline"]), "--markdown", str(md)])
    out = capsys.readouterr().out
    assert code == 1
    assert "]\\n✅ PASS\\x1b[2J\\u202e (cases/" in out  # the key, escaped
    assert_inert(out)
    assert_inert(md.read_text())


def test_versions_prints_report_strings_inert(gloo_run: Run, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "forged.json"
    write_json(str(path), forged_report(json.loads(gloo_run.json.read_text()), False))
    md = tmp_path / "versions.md"
    assert versions.main([str(path), str(gloo_run.json), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "all_reduce\\n✅ PASS\\x1b[2J" in out
    assert_inert(out)
    assert_inert(md.read_text())


def test_perf_gate_and_mutate_print_keys_inert() -> None:
    point = {"key": f"k{FORGED}", "bytes": 8, "busbw_gbs": 1.0, "busbw_gbs_min": 1.0,
             "busbw_gbs_max": 1.0}
    base = perfgate.PerfBaseline({"other" + FORGED: perfgate.PerfEntry("other" + FORGED, 8,
                                                                       1.0, 1.0, 1.0)})
    res = perfgate.compare({"perf": {"points": [point]}, "metadata": {}}, base)
    assert_inert(perfgate.render_text(res))
    doc = {"faults": [{"name": "f", "status": "killed", "killed_by": [
        {"nodeid": f"c.yaml::x{FORGED}", "outcome": "failed"}]},
        {"name": "g", "status": "inconclusive", "detail": f"pytest said{FORGED}"}],
        "score": {"killed": 1, "total": 2, "ratio": 0.5}, "faithful": {"passed": 1},
        "duration_s": 1.0, "survivors": []}
    assert_inert(mutate_cli.render(doc))


def test_printable_escapes_controls_only() -> None:
    assert printable("a\nb\x1b[2Jc\u202ed é ✅") == "a\\nb\\x1b[2Jc\\u202ed é ✅"
    assert printable("x" * 50, 10) == "x" * 9 + "…"


# -- point 5: outputs that cannot be written ----------------------------------------------------

def _outputs(where: Path) -> dict[str, str]:
    (where / "a-file").write_text("x")
    (where / "a-dir").mkdir()
    return {"directory": str(where / "a-dir"), "under-a-file": str(where / "a-file" / "out.md"),
            "unwritable": "/proc/collective-harness-test/out.md"}


@pytest.mark.parametrize("target", ["directory", "under-a-file", "unwritable"])
@pytest.mark.parametrize("option", ["--update", "--markdown", "--json", "perf-update",
                                    "versions-markdown"])
def test_unusable_output_paths_are_one_line_errors(
        option: str, target: str, good: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    if (option, target) == ("perf-update", "unwritable"):
        return  # refused only once written, and writing needs a --perf report: see --update
    out = _outputs(tmp_path)[target]
    report, base = str(good["report"]), str(good["baseline"])
    before = Path(base).read_bytes()
    argv = {"--update": [report, out, "--update"],
            "--markdown": [report, base, "--markdown", out],
            "--json": [report, base, "--json", out],
            "perf-update": ["--perf", report, out, "--update"]}.get(option)
    capsys.readouterr()
    code = versions.main([report, report, "--markdown", out]) if argv is None else cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and out in err and "Traceback" not in err, err
    assert Path(base).read_bytes() == before
    leftovers = [p for d in (tmp_path, tmp_path / "a-dir", Path(base).parent)
                 for p in d.glob(".tmp-*")]
    assert not leftovers
    assert os.path.isdir(tmp_path / "a-dir") and not list((tmp_path / "a-dir").iterdir())


@pytest.mark.parametrize("target", ["directory", "under-a-file"])
@pytest.mark.parametrize("command", ["collective-bench", "collective-bench --busbw",
                                     "collective-mutate"])
def test_bench_and_mutate_refuse_an_unusable_json_path_before_running(
        command: str, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _outputs(tmp_path)[target]
    main = {"collective-bench": bench.main, "collective-bench --busbw": busbw_bench.main,
            "collective-mutate": mutate_cli.main}[command]
    assert main(["--json", out]) == 2  # before any pool, pytest session or measurement
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and out in err and "Traceback" not in err, err
    assert not list((tmp_path / "a-dir").iterdir())
