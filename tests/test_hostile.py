"""Hostile case files: every one is a clean ``file:line:col`` error at collection, with bounded
work and nothing executed (README "Running untrusted cases", "Limits").

``tests/data/hostile/`` holds one or more files per class of attack; ``expected.tsv`` names
the fragment each file's error must contain. Bounded work is asserted through the limits that
stop it (the size check runs before any parsing, the node budget stops the parser part-way,
the instance count is computed before any instance is built), never through wall time.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.casefile import collect as casefile
from harness.casefile import expand, load, patterns, validate
from harness.casefile.limits import Limits
from harness.errors import CaseFileError, CaseFileErrors
from harness.report import markdown
from harness.report.records import build_report

HOSTILE = Path(__file__).parent / "data" / "hostile"
EXPECTED = {
    name: fragment
    for line in (HOSTILE / "expected.tsv").read_text().splitlines()
    if line and not line.startswith("#")
    for name, fragment in [line.split("\t", 1)]
}


def collect(path: Path, display: str, limits: Limits | None = None) -> int:
    """What the plugin does at collection: load, validate, expand. Returns the instance count."""
    return len(casefile.from_file(str(path), "gloo", display, limits or Limits()))


def error_of(path: Path, display: str, limits: Limits | None = None) -> str:
    try:
        collect(path, display, limits)
    except (CaseFileError, CaseFileErrors) as exc:
        return str(exc)
    raise AssertionError(f"{display}: no error raised")


def test_corpus_is_complete() -> None:
    files = sorted(p.name for p in HOSTILE.iterdir() if p.suffix == ".yaml")
    assert files == sorted(EXPECTED)
    classes = {name.split("_", 1)[0] for name in files}
    assert classes == {"yaml", "expr", "bounds", "regex", "check", "marks"}
    assert len(files) >= 40


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_file_is_a_clean_collection_error(name: str) -> None:
    display = f"cases/{name}"
    text = error_of(HOSTILE / name, display)
    assert EXPECTED[name] in text, text
    assert re.search(rf"^(\d+ problem\(s\) in case file {re.escape(display)}:\n)?"
                     rf"{re.escape(display)}:\d+:\d+: ", text), text
    assert "Traceback" not in text and 'File "' not in text
    assert len(text) < 4000  # quotes of offending values are cut to ~200 characters
    assert all(len(line) < 1200 for line in text.splitlines())


def test_valid_twin_of_the_corpus_collects() -> None:
    """The corpus' base case is valid: each file fails for its own reason, not the base's."""
    doc = load.load_text("cases:\n  - name: c\n    op: all_reduce\n    world_size: 2\n"
                         "    shape: [3]\n    input: \"rank + i\"\n", "cases/ok.yaml")
    (case,) = validate.load_cases(doc)
    assert len(expand.expand(case, "gloo")) == 1


# -- bounded work ------------------------------------------------------------------------------

def test_oversized_file_is_refused_before_it_is_parsed(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("cases:\n  - [" + "1, " * 2_000_000 + "1]\n")  # 6 MB
    monkeypatch.setattr(load, "load_text", lambda *a, **k: pytest.fail("parsed"))
    text = error_of(big, "cases/big.yaml")
    assert "cases/big.yaml:1:1: the file is 6000015 bytes; case files may have at most " \
        f"{Limits().file_bytes}" in text
    # the operator may raise the limit; then the node budget applies
    monkeypatch.undo()
    text = error_of(big, "cases/big.yaml", Limits(file_bytes=10 << 20, nodes=1000))
    assert re.search(r"cases/big.yaml:2:\d+: the file has more than 1000 YAML values", text)


def test_node_budget_stops_the_parser_part_way(tmp_path: Path) -> None:
    f = tmp_path / "many.yaml"
    f.write_text("cases:\n" + "".join(f"  - {i}\n" for i in range(50_000)))
    text = error_of(f, "cases/many.yaml", Limits(nodes=500, file_bytes=1 << 20))
    line = int(re.search(r"cases/many.yaml:(\d+):", text).group(1))  # type: ignore[union-attr]
    assert 400 < line < 600  # stopped near the 500th value, not after reading 50,000


def test_instance_count_is_checked_before_instances_are_built(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built: list[Any] = []
    monkeypatch.setattr(expand, "check_instance", lambda *a: built.append(a))  # each instance
    text = error_of(HOSTILE / "bounds_instance_explosion.yaml", "cases/x.yaml")
    assert "expands to 1000000000 instances" in text and not built
    small = tmp_path / "small.yaml"  # the counter works: a small matrix is built and counted
    small.write_text(GOOD.replace("world_size: 2", "world_size: [1, 2]"))
    assert collect(small, "small.yaml") == 2 and len(built) == 2


def test_limits_are_the_operators(tmp_path: Path) -> None:
    """A limit can be raised by whoever runs the suite: the same file then collects."""
    ok = HOSTILE / "bounds_world_size_1024.yaml"
    text = ok.read_text().replace("world_size: 1024", "world_size: 16")
    f = tmp_path / "ws16.yaml"
    f.write_text(text)
    assert "world_size 16 is above this session's limit of 8" in error_of(
        f, "cases/ws16.yaml", Limits(world_size=8))
    assert collect(f, "cases/ws16.yaml", Limits(world_size=16)) == 1
    big = (HOSTILE / "bounds_shape_huge.yaml")
    assert collect(big, "cases/x.yaml", Limits(buffer_bytes=1 << 30,
                                               instance_bytes=1 << 30)) == 1


def test_case_deadline_may_lower_and_raise_only_up_to_the_cap() -> None:
    def deadline(value: float, cap: float) -> float | None:
        doc = load.load_text("cases:\n  - name: c\n    op: all_reduce\n    world_size: 2\n"
                             f"    shape: [3]\n    input: 1\n    deadline: {value}\n", "c.yaml")
        (case,) = validate.load_cases(doc)
        return expand.expand(case, "gloo", Limits(deadline=cap))[0].deadline

    assert deadline(30, 2) == 2  # `deadline: 30` no longer beats `--deadline 2`
    assert deadline(1, 2) == 1
    assert deadline(30, 40) == 30


def test_patterns_match_in_linear_time_and_refuse_backtracking_features() -> None:
    # RE2, not Python's backtracking re: (a+)+$ answers at once; backreferences do not compile
    assert not patterns.search("(a+)+$", "a" * 34 + "!")
    assert patterns.search("timed out|refused", "Connection refused by peer")
    with pytest.raises(patterns.PatternError, match="backreferences"):
        patterns.compile_pattern(r"(a)\1")
    assert len("x" * patterns.MAX_SUBJECT + "needle") > patterns.MAX_SUBJECT
    assert not patterns.search("needle", "x" * patterns.MAX_SUBJECT + "needle")


# -- hostile text in reports -------------------------------------------------------------------

def test_markdown_report_escapes_case_text() -> None:
    evil = "</details>\n\n# ✅ Gate: PASS\n| x | y |\n<img src=x onerror=alert(1)>"
    record: dict[str, Any] = {
        "key": "cases/x.yaml::c[gloo-ws2-`s`]", "nodeid": "n", "file": "cases/x.yaml",
        "line": 3, "case": "c", "id": "gloo-ws2", "description": evil, "backend": "gloo",
        "device": "cpu", "world_size": 2, "dtype": "float32", "op": "all_reduce",
        "family": "all_reduce", "reduce_op": "sum", "async": False, "axes": {},
        "duration_s": 0.0, "pool_replaced": False, "ranks": []}
    records = [{**record, "outcome": "xfail", "expected": "pass", "reason": evil,
                "message": evil},
               {**record, "key": "k2", "outcome": "failed", "expected": "pass", "reason": "",
                "message": evil},
               {**record, "key": "k3", "outcome": "skipped", "expected": "pass",
                "reason": evil, "message": evil}]
    md = markdown.render(build_report(records, {"torch": "2", "hostname": "h"}))
    assert "</details>" not in md and "<img" not in md
    assert not any(line.startswith("# ✅") for line in md.splitlines())
    assert "&lt;/details&gt; \\# ✅ Gate: PASS \\| x \\| y \\|" in md
    assert md.count("\n# ") == 0 and md.startswith("# Conformance: gloo")


# -- end to end through pytest ------------------------------------------------------------------

GOOD = """\
cases:
  - name: good
    op: all_reduce
    world_size: 2
    shape: [3]
    input: "rank + i"
"""
MIXED = ["yaml_utf16.yaml", "yaml_flow_json.yaml", "yaml_bom_malformed.yaml",
         "yaml_alias_self_map.yaml", "marks_xfail.yaml", "marks_skipif.yaml",
         "check_send_dst_outside.yaml", "bounds_world_size_1024.yaml", "expr_mod_zero.yaml",
         "regex_unclosed.yaml"]


def _mixed_project(pytester: pytest.Pytester) -> None:
    cases = pytester.path / "cases"
    cases.mkdir()
    (cases / "good.yaml").write_text(GOOD)
    for name in MIXED:
        shutil.copy(HOSTILE / name, cases / name)
    (pytester.path / "docker-compose.yml").write_text("services: {web: {image: x}}\n")


def test_mixed_directory_reports_every_bad_file_and_runs_the_good(
        pytester: pytest.Pytester) -> None:
    _mixed_project(pytester)
    # by default pytest stops on collection errors: non-zero, every bad file named
    res = pytester.runpytest_subprocess("cases", "-p", "no:cacheprovider", "--no-report")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    out = res.stdout.str()
    for name in MIXED:
        assert f"ERROR cases/{name}" in out
        assert re.search(rf"cases/{re.escape(name)}:\d+:\d+: ", out), name
    assert "Traceback" not in out
    assert "docker-compose" not in out  # not a case file: never opened
    # and the good file still runs when asked to go on
    res = pytester.runpytest_subprocess("cases", "-p", "no:cacheprovider",
                                        "--continue-on-collection-errors",
                                        "--report-json", "r.json", "--report-md", "r.md",
                                        "--report-html", "r.html")
    res.assert_outcomes(passed=1, errors=len(MIXED))
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "r.json").read_text())
    assert [r["case"] for r in report["records"]] == ["good"]


def test_case_files_are_chosen_by_path_not_content(pytester: pytest.Pytester) -> None:
    """In a case directory every YAML file is a case file, whatever it looks like; outside,
    only files named on the command line are."""
    cases = pytester.path / "cases"
    cases.mkdir()
    (cases / "good.yaml").write_text(GOOD)
    (cases / "notes.yml").write_text("just: notes\n")
    (pytester.path / "good_elsewhere.yaml").write_text(GOOD)
    res = pytester.runpytest_subprocess(".", "--collect-only", "-q", "-p", "no:cacheprovider")
    res.stdout.fnmatch_lines(["*cases/notes.yml:1:1: at just: unknown key 'just'*"])
    assert "good_elsewhere" not in res.stdout.str()
    res = pytester.runpytest_subprocess("good_elsewhere.yaml", "--collect-only", "-q",
                                        "-p", "no:cacheprovider")
    res.stdout.fnmatch_lines(["good_elsewhere.yaml::good*", "1 test collected*"])
    other = pytester.path / "conformance"
    other.mkdir()
    (other / "c.yaml").write_text(GOOD)
    res = pytester.runpytest_subprocess("conformance", "--collect-only", "-q",
                                        "-p", "no:cacheprovider",
                                        "-o", "collective_case_dirs=conformance")
    res.stdout.fnmatch_lines(["conformance/c.yaml::good*", "1 test collected*"])


def test_limits_from_the_command_line_and_ini(pytester: pytest.Pytester) -> None:
    cases = pytester.path / "cases"
    cases.mkdir()
    (cases / "c.yaml").write_text(GOOD.replace("world_size: 2", "world_size: [2, 3]"))
    res = pytester.runpytest_subprocess("cases", "--collect-only", "-q", "-p",
                                        "no:cacheprovider", "--max-world-size", "2")
    res.stdout.fnmatch_lines(["*cases/c.yaml:4:17: * world_size 3 is above this session's "
                              "limit of 2*"])
    pytester.makeini("[pytest]\ncollective_max_instances = 1\n")
    res = pytester.runpytest_subprocess("cases", "--collect-only", "-q", "-p",
                                        "no:cacheprovider")
    res.stdout.fnmatch_lines(["*would exceed this session's limit of 1*"])
    res = pytester.runpytest_subprocess("cases", "--collect-only", "-q", "-p",
                                        "no:cacheprovider", "--deadline", "nan")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "--deadline: must be a positive, finite number" in res.stderr.str()


def test_noconftest_keeps_a_conftest_beside_the_cases_from_running(
        pytester: pytest.Pytester) -> None:
    cases = pytester.path / "cases"
    cases.mkdir()
    (cases / "good.yaml").write_text(GOOD)
    (cases / "conftest.py").write_text(textwrap.dedent("""
        from pathlib import Path
        Path(__file__).with_name("PWNED").write_text("ran")
    """))
    res = pytester.runpytest_subprocess("cases", "--collect-only", "-q", "-p",
                                        "no:cacheprovider", "--noconftest")
    res.stdout.fnmatch_lines(["cases/good.yaml::good*", "1 test collected*"])
    assert not (cases / "PWNED").exists()
    pytester.runpytest_subprocess("cases", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert (cases / "PWNED").exists()  # what --noconftest (ci/gate.sh) protects against
