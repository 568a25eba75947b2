"""docs/reference/upstream.md must stay honest: it is rendered from
docs/upstream/behaviours.yaml (the page is byte-for-byte what the data renders), every case and
instance id the data names exists (collected with the harness's own loader for Gloo and NCCL),
and a re-audited row's status is the one its assertions give."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.docsgen import upstream_page
from harness.docsgen import upstream_table as table

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / upstream_page.SOURCE
PAGE = ROOT / upstream_page.PAGE

CASE_FILE = """\
cases:
  - name: one
    description: Mirrors upstream test_a.
    op: all_reduce
    world_size: 2
    shape: [3]
    input: "rank + i"
"""


@pytest.fixture(scope="module")
def data() -> table.Table:
    return table.load(DATA)


@pytest.fixture(scope="module")
def lib() -> table.Library:
    return table.collect(ROOT / "cases")


def test_page_is_what_the_data_renders(data: table.Table) -> None:
    assert PAGE.read_text(encoding="utf-8") == upstream_page.render(data), (
        "docs/reference/upstream.md differs from what docs/upstream/behaviours.yaml renders: run "
        "`python ci/docs/upstream_table.py`")


def test_every_named_case_and_instance_exists(data: table.Table, lib: table.Library) -> None:
    problems = table.problems(data, lib)
    assert not problems, "\n".join(problems)


def test_counts_on_the_page_are_the_rows(data: table.Table) -> None:
    c = table.counts(data)
    assert c["total"] == len(data.rows) == sum(c[s] for s in table.STATUSES)
    page = PAGE.read_text(encoding="utf-8")
    assert f"**covered: {c['covered']} of {c['total']}**" in page
    assert f"re-audited assertion by assertion: {c['audited']} of {c['total']}" in page
    # An audited row's status is derived, so no audited row can claim more than its parts.
    for r in data.rows:
        if r.audited:
            assert r.status == table.derived_status(r.assertions), r.id


def _write(tmp: Path, rows: str) -> Path:
    p = tmp / "t.yaml"
    p.write_text("preamble: p\ngained: g\nrows:\n" + rows, encoding="utf-8")
    return p


ROW = """\
  - id: U900
    family: x
    behaviour: y
    upstream: dt::test_a
    backends: gloo
    status: {status}
    audited: 2026-11-25
    assertions:
      - says: first
        status: covered
        checks: [{{case: cases/a.yaml::one, instances: [{inst}]}}]
      - says: second
        status: no
        reason: the format has no such step
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "a.yaml").write_text(CASE_FILE, encoding="utf-8")
    return tmp_path


def test_problems_catch_a_dishonest_table(tiny: Path) -> None:
    lib = table.collect(tiny / "cases")
    assert lib.instances[("a.yaml", "one")] == {"gloo-ws2-float32-sum-sync",
                                                "nccl-ws2-float32-sum-sync"}
    # Claims covered while one assertion is not; names an instance that does not exist.
    bad = table.load(_write(tiny, ROW.format(status="covered", inst="gloo-ws3-float32-sum-sync")))
    assert table.problems(bad, lib) == [
        "U900: status 'covered' but its assertions make it 'partly'",
        "U900: cases/a.yaml::one has no instance gloo-ws3-float32-sum-sync",
    ]
    good = table.load(_write(tiny, ROW.format(status="partly", inst="nccl-ws2-float32-sum-sync")))
    assert table.problems(good, lib) == []
    unaudited = table.load(_write(tiny, """\
  - {id: U901, family: x, behaviour: y, upstream: dt::test_b, backends: gloo, status: covered,
     ours: "`cases/a.yaml::one`, `::gone`"}
"""))
    assert table.problems(unaudited, lib) == [
        "U901: names cases/a.yaml::gone, which no case file holds",
        "U901: no named case's description cites ['test_b']",
    ]


@pytest.mark.parametrize(("rows", "message"), [
    ("  - {id: U1, family: x, behaviour: y, upstream: u, backends: b, status: covered, ours: o}\n",
     "is not U followed by three digits"),
    ("  - {id: U001, family: x, behaviour: y, upstream: u, backends: b, status: done, ours: o}\n",
     "is not one of covered"),
    ("  - {id: U001, family: x, behaviour: y, upstream: u, backends: b, status: covered,\n"
     "     audited: 2026-11-25, assertions: [{says: s, status: covered}]}\n",
     "a covered assertion names the case(s) that check it"),
    ("  - {id: U001, family: x, behaviour: y, upstream: u, backends: b, status: no,\n"
     "     audited: 2026-11-25, assertions: [{says: s, status: no}]}\n",
     "a no assertion gives its reason"),
    ("  - {id: U001, family: x, behaviour: y, upstream: u, backends: b, status: no, ours: o,\n"
     "     assertions: [{says: s, status: no, reason: r}]}\n",
     "says when it was audited"),
    ("  - {id: U001, family: x, behaviour: y, upstream: u, backends: b, status: no, ours: o}\n"
     "  - {id: U001, family: x, behaviour: y, upstream: u, backends: b, status: no, ours: o}\n",
     "repeated: U001"),
])
def test_load_rejects_a_malformed_table(tmp_path: Path, rows: str, message: str) -> None:
    with pytest.raises(table.TableError, match=r"t\.yaml: ") as exc:
        table.load(_write(tmp_path, rows))
    assert message in str(exc.value)


@pytest.mark.parametrize("content", [b"[" * 60000, "rows: [x]".encode("utf-16"), None])
def test_load_rejects_hostile_files(tmp_path: Path, content: bytes | None) -> None:
    p = tmp_path / "t.yaml"
    if content is None:
        p.mkdir()
    else:
        p.write_bytes(content)
    with pytest.raises(table.TableError, match=r"cannot read the table|expected a mapping"):
        table.load(p)


def test_cli_writes_then_checks_the_page(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tiny, ROW.format(status="partly", inst="gloo-ws2-float32-sum-sync"))
    page = tiny / "page.md"
    args = ["--data", str(data), "--cases", str(tiny / "cases"), "--page", str(page)]
    assert upstream_page.main(args) == 0
    assert upstream_page.main([*args, "--check"]) == 0
    page.write_text(page.read_text(encoding="utf-8").replace("partly: 1", "partly: 0"),
                    encoding="utf-8")
    assert upstream_page.main([*args, "--check"]) == 1
    assert "is not what" in capsys.readouterr().err
    # A false claim is reported and the page is not rewritten to carry it.
    before = page.read_text(encoding="utf-8")
    data.write_text(data.read_text(encoding="utf-8").replace("status: partly", "status: covered"),
                    encoding="utf-8")
    assert upstream_page.main(args) == 1
    assert "status 'covered' but its assertions make it 'partly'" in capsys.readouterr().err
    assert page.read_text(encoding="utf-8") == before
    data.write_text("rows: {", encoding="utf-8")
    assert upstream_page.main(args) == 2
    assert capsys.readouterr().err.startswith(f"upstream_table: {data}: cannot read the table")
