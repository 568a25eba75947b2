"""docs/upstream.md must stay honest: its counts match its table, and every row it calls
covered names bundled cases that exist and say which upstream test they mirror."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "upstream.md"
STATUSES = {"covered", "expressible", "partly", "no"}
# `cases/FILE.yaml::name`, or `::name` continuing the last file named in the same cell.
CASE_REF = re.compile(r"`(?:cases/([\w.-]+\.yaml))?::(\w+)`")
UPSTREAM_NAME = re.compile(r"test_\w+|\w+Test\b")


@dataclass(frozen=True)
class Row:
    uid: str
    upstream: str
    status: str
    ours: str


def split_row(line: str) -> list[str]:
    # A `\|` inside a cell is a literal bar (GitHub renders it so, even in code spans).
    inner = line.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def parse_doc(text: str) -> tuple[str, list[Row]]:
    rows: list[Row] = []
    for line in text.splitlines():
        if not line.startswith("| U"):
            continue
        cells = split_row(line)
        assert len(cells) == 7, f"row {cells[0]} has {len(cells)} cells, not 7: {line[:120]}"
        rows.append(Row(cells[0], cells[3], cells[5], cells[6]))
    by_id = {r.uid: r for r in rows}
    # "same as U073" in the upstream column borrows that row's upstream tests.
    resolved = []
    for r in rows:
        m = re.match(r"same as (U\d+)", r.upstream)
        resolved.append(Row(r.uid, by_id[m.group(1)].upstream, r.status, r.ours) if m else r)
    return text, resolved


def case_descriptions() -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for path in sorted((ROOT / "cases").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for case in data.get("cases", []):
            out[(path.name, case["name"])] = str(case.get("description", ""))
    return out


def case_refs(cell: str) -> list[tuple[str | None, str]]:
    refs: list[tuple[str | None, str]] = []
    current: str | None = None
    for m in CASE_REF.finditer(cell):
        current = m.group(1) or current
        refs.append((current, m.group(2)))
    return refs


def count_problems(text: str, rows: list[Row]) -> list[str]:
    counts = Counter(r.status for r in rows)
    total = len(rows)
    expressible = counts["covered"] + counts["expressible"]
    wanted = [
        f"**expressible: {expressible} of {total}**",
        f"**covered: {counts['covered']} of {total}**",
        f"partly expressible (not counted above): {counts['partly']} of {total}",
    ]
    return [f"counts line lacks {w!r}" for w in wanted if w not in text]


def coverage_problems(rows: list[Row], cases: dict[tuple[str, str], str]) -> list[str]:
    problems = []
    for r in rows:
        if r.status != "covered":
            continue
        refs = case_refs(r.ours)
        if not refs:
            problems.append(f"{r.uid}: covered but names no case")
            continue
        unknown = [f"{f}::{n}" for f, n in refs if (f or "", n) not in cases]
        if unknown:
            problems.append(f"{r.uid}: no such case {unknown}")
            continue
        names = set(UPSTREAM_NAME.findall(r.upstream))
        if not any(any(t in cases[(f or "", n)] for t in names) for f, n in refs):
            problems.append(f"{r.uid}: no named case's description cites {sorted(names)}")
    return problems


@pytest.fixture(scope="module")
def doc() -> tuple[str, list[Row]]:
    return parse_doc(DOC.read_text(encoding="utf-8"))


def test_ids_unique_and_statuses_known(doc: tuple[str, list[Row]]) -> None:
    _, rows = doc
    ids = [r.uid for r in rows]
    assert len(ids) == len(set(ids))
    assert {r.status for r in rows} <= STATUSES, {r.status for r in rows} - STATUSES


def test_counts_line_matches_table(doc: tuple[str, list[Row]]) -> None:
    text, rows = doc
    assert count_problems(text, rows) == []


def test_covered_rows_name_existing_cases_that_cite_upstream(
    doc: tuple[str, list[Row]],
) -> None:
    _, rows = doc
    problems = coverage_problems(rows, case_descriptions())
    assert not problems, "\n".join(problems)


def test_checks_fail_on_a_dishonest_table() -> None:
    text, rows = parse_doc(
        "**expressible: 2 of 3** · **covered: 2 of 3** · "
        "partly expressible (not counted above): 0 of 3\n"
        "| U900 | x | y | dt::test_a | gloo | covered | `cases/a.yaml::one`, `::two` |\n"
        "| U901 | x | y | dt::test_b | gloo | covered | `cases/a.yaml::gone` |\n"
        "| U902 | x | y | same as U900 | gloo | covered | `cases/a.yaml::two` |\n"
    )
    assert rows[2].upstream == "dt::test_a"
    cases = {("a.yaml", "one"): "Mirrors upstream test_a.", ("a.yaml", "two"): "no citation"}
    assert coverage_problems(rows, cases) == [
        "U901: no such case ['a.yaml::gone']",
        "U902: no named case's description cites ['test_a']",
    ]
    assert count_problems(text, rows) == [
        "counts line lacks '**expressible: 3 of 3**'",
        "counts line lacks '**covered: 3 of 3**'",
    ]
