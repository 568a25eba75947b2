"""The fast schema check (harness.schemacheck: fastjsonschema) against jsonschema: never more
lenient.

The report writer, the report reader and case-file collection accept a document on the
fast check's word alone, so every document it accepts must be one jsonschema accepts.
Proved on the committed reference reports and on thousands of mutations of their records (each
mutation compared with jsonschema's verdict), on small schemas for each keyword's edge cases,
and by refusing a schema with a keyword it does not implement.
"""

from __future__ import annotations

import copy
import glob
import gzip
import json
import random
from typing import Any

import jsonschema
import pytest

from harness import schemacheck
from harness.casefile import load
from harness.casefile import schema as case_schema
from harness.report.records import report_check, report_schema, validate_report

REFERENCES = sorted(glob.glob("reports/reference/**/*.json.gz", recursive=True))
# Varied records: the quick suite on Gloo, and GPU runs with ordering probes and perf sections.
VARIED = ["reports/reference/gloo-cpu-quick-torch2.13.0.json.gz",
          "reports/reference/gpu-h200-torch2.11.0/ordering-nccl.json.gz",
          "reports/reference/gpu-h200-torch2.11.0/perf-nccl.json.gz"]


def _load(path: str) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return dict(json.load(fh))


def _js_ok(schema: Any, doc: Any) -> bool:
    return not any(True for _ in jsonschema.Draft202012Validator(schema).iter_errors(doc))


def test_the_shipped_schemas_compile() -> None:
    # A schema the checker cannot compile would silently fall back to jsonschema's speed.
    schemacheck.compile_schema(report_schema())
    schemacheck.compile_schema(case_schema.case_schema())


@pytest.mark.parametrize("path", REFERENCES)
def test_reference_reports_pass_the_compiled_check(path: str) -> None:
    # Valid reports take the fast path (the mutations below prove its yes is jsonschema's).
    assert report_check()(_load(path))


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*here, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*here, i))
    return out


def _mutate(doc: Any, path: tuple[Any, ...], rng: random.Random) -> Any:
    """``doc`` with the value at ``path`` changed in one of the ways a writer bug could."""
    *parent_path, last = path
    parent = doc
    for p in parent_path:
        parent = parent[p]
    old = parent[last]
    choice = rng.randrange(9)
    if choice == 0 and isinstance(parent, dict):
        del parent[last]  # a required key gone (or an optional one: both must agree)
    elif choice == 1 and isinstance(parent, dict):
        parent["zz_unknown"] = 1  # an extra key where additionalProperties may be false
    else:
        parent[last] = [None, "x", -1, 1.5, True, [], {}, -0.5, "passed"][choice]
    del old
    return doc


@pytest.mark.parametrize("path", VARIED)
def test_mutated_records_agree_with_jsonschema(path: str) -> None:
    schema = report_schema()
    check = report_check()
    doc = _load(path)
    rng = random.Random(7)
    records = rng.sample(doc["records"], min(40, len(doc["records"])))
    seen = {True: 0, False: 0}
    for record in records:
        for where in rng.sample(_paths(record)[1:], min(25, len(_paths(record)) - 1)):
            small = {**doc, "records": [_mutate(copy.deepcopy(record), where, rng)]}
            fast, slow = check(small), _js_ok(schema, small)
            assert fast == slow, (where, small["records"][0])
            seen[fast] += 1
    assert seen[True] > 100 and seen[False] > 100, seen  # both verdicts were exercised


@pytest.mark.parametrize("name", ["all_reduce.yaml", "groups.yaml", "p2p.yaml",
                                  "fault_tolerance.yaml"])
def test_mutated_case_files_agree_with_jsonschema(name: str) -> None:
    schema = case_schema.case_schema()
    check = schemacheck.compile_schema(schema)
    data = case_schema._jsonable(load.load_file(f"cases/{name}").data)
    assert check(data)
    rng = random.Random(11)
    cases = rng.sample(data["cases"], min(15, len(data["cases"])))
    seen = {True: 0, False: 0}
    for case in cases:
        for where in rng.sample(_paths(case)[1:], min(20, len(_paths(case)) - 1)):
            small = {**data, "cases": [_mutate(copy.deepcopy(case), where, rng)]}
            fast, slow = check(small), _js_ok(schema, small)
            assert fast <= slow, (where, small["cases"][0])  # a yes is always jsonschema's
            seen[fast] += 1
    assert seen[True] > 20 and seen[False] > 20, seen


@pytest.mark.parametrize(("schema", "doc", "fast", "slow"), [
    ({"type": "integer"}, 1, True, True),
    ({"type": "integer"}, True, False, False),
    ({"type": "integer"}, 1.0, True, True),  # an integral float is an integer in both
    ({"type": "number"}, False, False, False),
    ({"type": ["string", "null"]}, None, True, True),
    ({"enum": [1, "a"]}, True, False, False),
    ({"enum": [1.0]}, 1, True, True),
    ({"const": 1}, True, False, False),  # a boolean is not the number 1 (Python says it is)
    ({"const": True}, 1, False, False),
    ({"dependentRequired": {"a": ["b"]}}, {"a": 1}, False, False),  # as draft 7 dependencies
    ({"dependentRequired": {"a": ["b"]}}, {"a": 1, "b": 2}, True, True),
    ({"const": "x"}, "x", True, True),
    ({"minimum": 0}, -1, False, False),
    ({"minimum": 0}, "text", True, True),
    ({"exclusiveMinimum": 0}, 0, False, False),
    ({"minItems": 1}, [], False, False),
    ({"minLength": 2}, "a", False, False),
    ({"pattern": "^a"}, "ba", False, False),
    ({"properties": {"a": {"type": "string"}}, "required": ["a"]}, {}, False, False),
    ({"properties": {"a": {"type": "string"}}, "additionalProperties": False}, {"b": 1},
     False, False),
    ({"additionalProperties": {"type": "integer"}}, {"b": "x"}, False, False),
    ({"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
     {"xa": 1}, True, True),
    ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, 3, False, False),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "s", True, True),
    ({"not": {"type": "string"}}, "s", False, False),
    ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                      "additionalProperties": False}}, "$ref": "#/$defs/n"},
     {"next": {"next": {"bad": 1}}}, False, False),
    ({"items": {"type": "integer"}}, [1, "2"], False, False),
    (False, 1, False, False),
])
def test_keywords(schema: Any, doc: Any, fast: bool, slow: bool) -> None:
    assert schemacheck.compile_schema(schema)(doc) is fast
    assert _js_ok(schema, doc) is slow


@pytest.mark.parametrize("schema", [{"format": "date"}, {"$ref": "other.json"},
                                    {"items": [{"type": "integer"}]},
                                    {"enum": [[1]]}, {"dependentSchemas": {}}])
def test_what_it_does_not_implement_is_refused(schema: Any) -> None:
    with pytest.raises(schemacheck.Unsupported):
        schemacheck.compile_schema(schema)


def test_a_rejected_report_gets_jsonschemas_error() -> None:
    doc = _load(REFERENCES[0])
    doc["records"] = [dict(doc["records"][0], outcome="maybe")]
    with pytest.raises(jsonschema.ValidationError, match="maybe"):
        validate_report(doc)
