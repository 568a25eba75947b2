"""JUnit XML of a user's run: per-test properties (backend, world size, dtype, op, YAML
file:line, outcome and its one-line detail) and, in the xunit1 family, file/line attributes
that point into the YAML file."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.runs import CASES, Run


def junit_cases(path: Path) -> dict[str, tuple[dict[str, str], dict[str, str], list[str]]]:
    """name -> (attributes, properties, child tags) of each <testcase>."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in tc.iter("property")}
        out[tc.get("name", "")] = (dict(tc.attrib), props, [c.tag for c in tc])
    return out


def case_line(name: str) -> int:
    lines = CASES.read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if ln.strip() == f"- name: {name}")


def test_user_run_has_properties_with_default_family_and_xdist(pytester: pytest.Pytester
                                                               ) -> None:
    """A project that configures nothing (pytest's default xunit2), run with -n 2: every
    property still reaches the XML from the xdist workers."""
    (pytester.path / "cases").mkdir()
    (pytester.path / "cases" / "c.yaml").write_text(CASES.read_text())
    result = pytester.runpytest_subprocess("cases", "-n", "2", "-p", "no:cacheprovider",
                                           "--junitxml=junit.xml", "--no-report")
    result.assert_outcomes(passed=9, skipped=1, xfailed=1)
    tcs = junit_cases(pytester.path / "junit.xml")
    assert len(tcs) == 11
    attrs, props, _ = tcs["ar[gloo-ws2-int64-sum-async]"]
    assert props == {"backend": "gloo", "world_size": "2", "dtype": "int64", "op": "all_reduce",
                     "yaml": f"cases/c.yaml:{case_line('ar')}", "outcome": "passed"}
    assert "file" not in attrs  # xunit2 drops file/line: the `yaml` property carries them
    _, skipped, tags = tcs["not_here[gloo-ws2-float32-sum-sync]"]
    assert skipped["outcome"] == "skipped" and "skipped" in tags
    assert skipped["detail"] == "test data - skipped on purpose"
    _, xfail, _ = tcs["known_wrong[gloo-ws2-float32-sum-sync]"]
    assert xfail["outcome"] == "xfail"
    assert xfail["reason"] == "test data - the expectation is wrong on purpose"
    assert xfail["detail"].startswith("wrong values on rank(s) 0-1")


def test_xunit1_points_at_the_yaml_case_and_says_what_failed(faulty_run: Run) -> None:
    tcs = junit_cases(faulty_run.reports / "junit.xml")
    attrs, props, tags = tcs["bc[faulty-ws2-int64-sync-src0]"]
    line = case_line("bc")
    assert attrs["file"] == "cases/cases.yaml"
    assert int(attrs["line"]) == line - 1  # pytest writes reportinfo's 0-based line
    assert props["yaml"] == f"cases/cases.yaml:{line}"
    assert props["backend"] == "faulty" and props["world_size"] == "2"
    assert props["dtype"] == "int64" and props["op"] == "broadcast"
    assert props["outcome"] == "failed" and "failure" in tags
    assert props["detail"].startswith("wrong values on rank(s) 1: rank 1, buffer 'tensor'")
    passed = tcs["ar[faulty-ws1-int64-sum-sync]"][1]
    assert passed["outcome"] == "passed" and "detail" not in passed
