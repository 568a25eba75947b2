"""Load and check the upstream-parity table (docs/upstream/behaviours.yaml) against the
bundled case library (``collect``: every case's description and the instance ids it expands to
on Gloo and on NCCL, with the harness's own loader).

A row maps one group of upstream assertions to the cases that check them. A row that was
re-audited against upstream's source lists each assertion with the case and instance ids that
check it, and its status is derived from theirs, so a row cannot claim more than its parts.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..casefile import collect as casefile
from ..errors import CaseFileError, CaseFileErrors, quote

STATUSES = ("covered", "expressible", "partly", "no")
ROW_ID = re.compile(r"U\d{3}\Z")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
# `cases/FILE.yaml::name`, or `::name` continuing the last file named in the same text.
CASE_REF = re.compile(r"`(?:cases/([\w.-]+\.ya?ml))?::(\w+)`")
CHECK_REF = re.compile(r"cases/([\w.-]+\.ya?ml)::(\w+)\Z")
UPSTREAM_NAME = re.compile(r"test_\w+|\w+Test\b")
ROW_KEYS = {"id", "family", "behaviour", "upstream", "backends", "status", "ours", "audited",
            "assertions"}
ASSERTION_KEYS = {"says", "status", "checks", "reason"}


class TableError(Exception):
    """The table file cannot be read or is not shaped like a table (one line for a terminal)."""


@dataclass(frozen=True)
class Check:
    """A case that checks an assertion, and the instance ids (of either backend) that do."""

    file: str  # the file name under cases/
    case: str
    instances: tuple[str, ...]


@dataclass(frozen=True)
class Assertion:
    """One upstream assertion, and what states it here."""

    says: str
    status: str
    checks: tuple[Check, ...]
    reason: str


@dataclass(frozen=True)
class Row:
    """One behaviour: a group of assertions of one upstream test that belong together."""

    id: str
    family: str
    behaviour: str
    upstream: str
    backends: str
    status: str
    ours: str
    audited: str  # the date of the assertion-by-assertion re-check, "" if not re-checked
    assertions: tuple[Assertion, ...]


@dataclass(frozen=True)
class Table:
    """The whole table: prose kept with the data, and the rows in id order."""

    preamble: str
    gained: str
    rows: tuple[Row, ...]


def _text(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = obj.get(key, "")
    if value is None or (required and value == ""):
        raise TableError(f"{where}: {key!r} is missing")
    if not isinstance(value, str):
        raise TableError(f"{where}: {key!r} must be text, not {quote(value, 60)}")
    return value


def _status(obj: dict[str, Any], where: str) -> str:
    if obj.get("status") is False:  # YAML 1.1 reads a bare ``no`` as false
        return "no"
    status = _text(obj, "status", where)
    if status not in STATUSES:
        raise TableError(f"{where}: status {quote(status)} is not one of {', '.join(STATUSES)}")
    return status


def _mapping(obj: Any, where: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise TableError(f"{where}: expected a mapping, got {quote(obj, 60)}")
    unknown = sorted(str(k) for k in obj if k not in keys)
    if unknown:
        raise TableError(f"{where}: unknown key(s) {', '.join(map(quote, unknown))} "
                         f"(known: {', '.join(sorted(keys))})")
    return obj


def _check(obj: Any, where: str) -> Check:
    m = _mapping(obj, where, {"case", "instances"})
    ref = _text(m, "case", where)
    parts = CHECK_REF.match(ref)
    if not parts:
        raise TableError(f"{where}: case {quote(ref)} is not written cases/FILE.yaml::name")
    ids = m.get("instances")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise TableError(f"{where}: 'instances' must be a non-empty list of instance ids "
                         "(the bracket part of the test id, e.g. gloo-ws2-float32-sum-sync)")
    return Check(parts.group(1), parts.group(2), tuple(ids))


def _assertion(obj: Any, where: str) -> Assertion:
    m = _mapping(obj, where, ASSERTION_KEYS)
    status = _status(m, where)
    raw_checks = m.get("checks", [])
    if not isinstance(raw_checks, list):
        raise TableError(f"{where}: 'checks' must be a list")
    checks = tuple(_check(c, f"{where}, check {n + 1}") for n, c in enumerate(raw_checks))
    reason = _text(m, "reason", where, required=False)
    if status in ("covered", "partly") and not checks:
        raise TableError(f"{where}: a {status} assertion names the case(s) that check it")
    if status in ("expressible", "no") and checks:
        raise TableError(f"{where}: a {status} assertion names no case; its reason says why")
    if status != "covered" and not reason:
        raise TableError(f"{where}: a {status} assertion gives its reason")
    return Assertion(_text(m, "says", where), status, checks, reason)


def _row(obj: Any, n: int) -> Row:
    where = f"row {n + 1}"
    m = _mapping(obj, where, ROW_KEYS)
    uid = _text(m, "id", where)
    if not ROW_ID.match(uid):
        raise TableError(f"{where}: id {quote(uid)} is not U followed by three digits")
    where = uid
    status = _status(m, where)
    audited = m.get("audited", "")
    audited = str(audited) if audited is not None else ""  # YAML reads a bare date as a date
    if audited and not DATE.match(audited):
        raise TableError(f"{where}: audited {quote(audited)} is not a date (YYYY-MM-DD)")
    raw = m.get("assertions", [])
    if not isinstance(raw, list):
        raise TableError(f"{where}: 'assertions' must be a list")
    assertions = tuple(_assertion(a, f"{where}, assertion {k + 1}") for k, a in enumerate(raw))
    if audited and not assertions:
        raise TableError(f"{where}: an audited row lists its assertions")
    if assertions and not audited:
        raise TableError(f"{where}: a row that lists assertions says when it was audited")
    return Row(uid, _text(m, "family", where), _text(m, "behaviour", where),
               _text(m, "upstream", where), _text(m, "backends", where), status,
               _text(m, "ours", where, required=not assertions), audited, assertions)


def load(path: Path) -> Table:
    """The table at ``path``, or TableError saying what is wrong and where."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, RecursionError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TableError(f"{path}: cannot read the table: {first}") from None
    top = _mapping(data, str(path), {"preamble", "gained", "rows"})
    rows_raw = top.get("rows")
    if not isinstance(rows_raw, list) or not rows_raw:
        raise TableError(f"{path}: 'rows' must be a non-empty list")
    try:
        rows = tuple(_row(r, n) for n, r in enumerate(rows_raw))
        table = Table(_text(top, "preamble", "top level"), _text(top, "gained", "top level"),
                      rows)
    except TableError as exc:
        raise TableError(f"{path}: {exc}") from None
    ids = [r.id for r in rows]
    if ids != sorted(set(ids)):
        dup = sorted(i for i, c in Counter(ids).items() if c > 1)
        raise TableError(f"{path}: row ids must be unique and in order"
                         + (f" (repeated: {', '.join(dup)})" if dup else ""))
    return table


def derived_status(assertions: Iterable[Assertion]) -> str:
    """A row's status from its assertions': covered only if every one is."""
    seen = {a.status for a in assertions}
    if seen <= {"covered"}:
        return "covered"
    if seen <= {"covered", "expressible"}:
        return "expressible"
    if seen == {"no"}:
        return "no"
    return "partly"


def counts(table: Table) -> dict[str, int]:
    """Rows per status, plus the total and the number of audited rows."""
    c = Counter(r.status for r in table.rows)
    out = {s: c[s] for s in STATUSES}
    out["total"] = len(table.rows)
    out["audited"] = sum(1 for r in table.rows if r.audited)
    return out


def text_refs(text: str) -> list[tuple[str, str]]:
    """The `cases/F.yaml::name` references in prose (a bare `::name` continues the last file)."""
    refs: list[tuple[str, str]] = []
    current = ""
    for m in CASE_REF.finditer(text):
        current = m.group(1) or current
        refs.append((current, m.group(2)))
    return refs


@dataclass(frozen=True)
class Library:
    """What the bundled case files hold: descriptions by (file, case), instance ids by case."""

    descriptions: dict[tuple[str, str], str]
    instances: dict[tuple[str, str], frozenset[str]]


def problems(table: Table, lib: Library) -> list[str]:
    """Every way the table says more than the case files hold (empty when it is true)."""
    out: list[str] = []
    by_id = {r.id: r for r in table.rows}
    for r in table.rows:
        if r.assertions and derived_status(r.assertions) != r.status:
            out.append(f"{r.id}: status {r.status!r} but its assertions make it "
                       f"{derived_status(r.assertions)!r}")
        prose = [r.ours] + [a.reason for a in r.assertions]
        refs = [ref for t in prose for ref in text_refs(t)]
        if any(ref[0] == "" for ref in refs):
            out.append(f"{r.id}: a `::name` reference comes before any `cases/FILE.yaml::name`")
        for f, case in refs:
            if f and (f, case) not in lib.descriptions:
                out.append(f"{r.id}: names cases/{f}::{case}, which no case file holds")
        checks = [c for a in r.assertions for c in a.checks]
        for c in checks:
            have = lib.instances.get((c.file, c.case))
            if have is None:
                out.append(f"{r.id}: checks name cases/{c.file}::{c.case}, which no case "
                           "file holds")
                continue
            missing = [i for i in c.instances if i not in have]
            if missing:
                out.append(f"{r.id}: cases/{c.file}::{c.case} has no instance "
                           f"{', '.join(missing[:5])}")
        if r.status == "covered":
            named = {(c.file, c.case) for c in checks} | {x for x in refs if x[0]}
            if not named:
                out.append(f"{r.id}: covered but names no case")
            same = re.match(r"same as (U\d{3})", r.upstream)
            source = by_id[same.group(1)].upstream if same and same.group(1) in by_id else ""
            tests = set(UPSTREAM_NAME.findall(source or r.upstream))
            cited = any(t in lib.descriptions.get(ref, "") for ref in named for t in tests)
            if named and not cited:
                out.append(f"{r.id}: no named case's description cites {sorted(tests)}")
    return out


BACKENDS = ("gloo", "nccl")  # the backends a row may name


def collect(case_dir: Path) -> Library:
    """The cases under ``case_dir`` (every ``*.yaml`` holding ``cases:``), expanded for each
    backend the table's rows name; TableError if a case file does not load."""
    descriptions: dict[tuple[str, str], str] = {}
    instances: dict[tuple[str, str], set[str]] = {}
    for path in sorted(case_dir.glob("*.yaml")):
        try:
            cases = casefile.cases_of_file(str(path), str(path))
            for case in cases:
                descriptions[(path.name, case.name)] = case.description
                instances.setdefault((path.name, case.name), set())
            for backend in BACKENDS:
                for inst in casefile.instances(cases, backend, str(path)):
                    instances[(path.name, inst.case)].add(inst.id)
        except (CaseFileError, CaseFileErrors) as exc:
            first = str(exc).splitlines()[0]
            raise TableError(f"{path}: the case file does not load: {first}") from None
    return Library(descriptions, {k: frozenset(v) for k, v in instances.items()})
