"""A fast yes-or-no check of a document against a JSON Schema, compiled once into functions.

jsonschema's validator walks the schema anew for every value and builds a validator object
per step: on the quick suite's report (3,300 records) it took 2.7 s of the 3.3 s the JSON
report cost to write, and its case files' checks a good part of collection. Both schemas use
a small set of keywords; :func:`compile_schema` turns a schema made of those keywords into
nested Python functions that answer only *is this valid?*.

The answer is never more lenient than jsonschema's: where the two could differ (an integral
float for ``"integer"``, ``1`` against ``enum: [1.0]``) this check says no, and the caller
then asks jsonschema, which decides and words the error. A schema that uses any keyword not
listed in :data:`KEYWORDS` (or a ``$ref`` that is not ``#/$defs/NAME``) is refused at compile
time with :class:`Unsupported`, so a later edit of a schema can make the check slower, never
wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

# Keywords that only annotate: they never make a document invalid.
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description",
                         "default", "examples", "markdownDescription", "deprecated"})
KEYWORDS = frozenset({"type", "enum", "const", "properties", "required",
                      "additionalProperties", "items", "minItems", "maxItems", "minLength",
                      "maxLength", "minimum", "maximum", "exclusiveMinimum",
                      "exclusiveMaximum", "allOf", "anyOf", "oneOf", "not", "$ref", "pattern",
                      "patternProperties", "minProperties", "maxProperties", "uniqueItems",
                      "propertyNames", "dependentRequired"}) | ANNOTATIONS
DEFS = "#/$defs/"
SCALARS = (str, bool, int, float, type(None))
UNIQUE_PAIRWISE_MAX = 64


class Unsupported(ValueError):
    """The schema uses something this checker does not implement (use jsonschema)."""


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": _is_number,
}


def _same(value: Any, allowed: Any) -> bool:
    """JSON equality of two scalars, stricter than jsonschema's (the types must match)."""
    return type(value) is type(allowed) and value == allowed


def compile_schema(schema: Any) -> Check:
    """The check of ``schema`` (a dict or a boolean schema); :class:`Unsupported` if it uses
    a keyword or a reference this module does not implement."""
    defs: dict[str, Check] = {}
    raw_defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}

    def ref(target: Any) -> Check:
        if not (isinstance(target, str) and target.startswith(DEFS)
                and target[len(DEFS):] in raw_defs):
            raise Unsupported(f"$ref {target!r}")
        name = target[len(DEFS):]
        return lambda v: defs[name](v)  # looked up at check time: definitions may recurse

    def build(node: Any) -> Check:
        if node is True:
            return lambda v: True
        if node is False:
            return lambda v: False
        if not isinstance(node, dict):
            raise Unsupported(f"schema {type(node).__name__}")
        unknown = set(node) - KEYWORDS
        if unknown:
            raise Unsupported(f"keyword {sorted(unknown)[0]!r}")
        checks: list[Check] = []
        if "type" in node:
            names = node["type"] if isinstance(node["type"], list) else [node["type"]]
            if any(n not in TYPES for n in names):
                raise Unsupported(f"type {names!r}")
            checks.append(_any_of(tuple(TYPES[n] for n in names)))
        for key in ("enum", "const"):
            if key in node:
                allowed = node["enum"] if key == "enum" else [node["const"]]
                if not all(isinstance(a, SCALARS) for a in allowed):
                    raise Unsupported(f"{key} of a non-scalar")
                checks.append(_one_of_values(tuple(allowed)))
        checks += _numbers(node) + _sizes(node)
        if "pattern" in node:
            rx = re.compile(node["pattern"])
            checks.append(lambda v: not isinstance(v, str) or rx.search(v) is not None)
        if {"properties", "required", "additionalProperties", "patternProperties"} & set(node):
            checks.append(_object(node, build))
        if "propertyNames" in node:
            key_check = build(node["propertyNames"])
            checks.append(lambda v: not isinstance(v, dict) or all(key_check(k) for k in v))
        if "dependentRequired" in node:
            needs = {k: tuple(n) for k, n in node["dependentRequired"].items()}
            checks.append(lambda v: not isinstance(v, dict) or all(
                n in v for k, ns in needs.items() if k in v for n in ns))
        if node.get("uniqueItems") is True:
            checks.append(_unique)
        if "items" in node:
            if isinstance(node["items"], list):
                raise Unsupported("items as a list")
            each = build(node["items"])
            checks.append(lambda v: not isinstance(v, list) or all(each(x) for x in v))
        if "allOf" in node:
            checks.append(_all_of(tuple(build(s) for s in node["allOf"])))
        if "anyOf" in node:
            checks.append(_any_of(tuple(build(s) for s in node["anyOf"])))
        if "oneOf" in node:
            checks.append(_exactly_one(tuple(build(s) for s in node["oneOf"])))
        if "not" in node:
            neg = build(node["not"])
            checks.append(lambda v: not neg(v))
        if "$ref" in node:
            checks.append(ref(node["$ref"]))
        if not checks:
            return lambda v: True
        return checks[0] if len(checks) == 1 else _all_of(tuple(checks))

    for name, sub in raw_defs.items():
        defs[name] = build(sub)
    return build(schema)


def _all_of(checks: tuple[Check, ...]) -> Check:
    return lambda v: all(f(v) for f in checks)


def _any_of(checks: tuple[Check, ...]) -> Check:
    return lambda v: any(f(v) for f in checks)


def _exactly_one(checks: tuple[Check, ...]) -> Check:
    return lambda v: sum(f(v) for f in checks) == 1


def _one_of_values(allowed: tuple[Any, ...]) -> Check:
    return lambda v: any(_same(v, x) for x in allowed)


def _bound(key: str, bound: float) -> Check:
    if key == "minimum":
        return lambda v: not _is_number(v) or v >= bound
    if key == "maximum":
        return lambda v: not _is_number(v) or v <= bound
    if key == "exclusiveMinimum":
        return lambda v: not _is_number(v) or v > bound
    return lambda v: not _is_number(v) or v < bound


def _size(kind: Any, n: int, least: bool) -> Check:
    """``kind`` is list, str or dict: all sized."""
    if least:
        return lambda v: not isinstance(v, kind) or len(v) >= n
    return lambda v: not isinstance(v, kind) or len(v) <= n


def _numbers(node: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in node:
            bound = node[key]
            if not _is_number(bound):
                raise Unsupported(f"{key} {bound!r}")
            out.append(_bound(key, bound))
    return out


def _sizes(node: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    for key, kind, least in (("minItems", list, True), ("maxItems", list, False),
                             ("minLength", str, True), ("maxLength", str, False),
                             ("minProperties", dict, True), ("maxProperties", dict, False)):
        if key in node:
            n = node[key]
            if not (isinstance(n, int) and not isinstance(n, bool)):
                raise Unsupported(f"{key} {n!r}")
            out.append(_size(kind, n, least))
    return out


def _unique(v: Any) -> bool:
    """No two items equal by Python's ``==``, which calls equal every pair JSON does (and a
    few more: ``True == 1``; then jsonschema decides). A long list is left to jsonschema,
    which sorts where it can: pairwise here would be quadratic in hostile input."""
    if not isinstance(v, list):
        return True
    if len(v) > UNIQUE_PAIRWISE_MAX:
        return False
    return all(v[i] != v[j] for i in range(len(v)) for j in range(i))


def _object(node: dict[str, Any], build: Callable[[Any], Check]) -> Check:
    props = {k: build(s) for k, s in node.get("properties", {}).items()}
    patterns = [(re.compile(p), build(s)) for p, s in node.get("patternProperties", {}).items()]
    required = tuple(node.get("required", ()))
    extra = node.get("additionalProperties", True)
    others: Check | None = None if extra is True else build(extra)

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for key in required:
            if key not in v:
                return False
        for key, value in v.items():
            if not isinstance(key, str):
                return False  # not a JSON document: let jsonschema say what it makes of it
            own = props.get(key)
            if own is not None and not own(value):
                return False
            matched = False
            for rx, sub in patterns:
                if rx.search(key) is not None:
                    matched = True
                    if not sub(value):
                        return False
            if own is None and not matched and others is not None and not others(value):
                return False
        return True

    return check
