"""A fast yes-or-no check of a document against a JSON Schema: fastjsonschema's generated
validator, with jsonschema kept to word a refusal.

Why: jsonschema's validator walks the schema anew for every value; on the quick suite's report
(3,300 records) it took 2.7 s of the 3.3 s the JSON report cost to write, and its case-file
checks a good part of collection. fastjsonschema compiles a schema once into Python code. The
callers accept a document on this check's word alone and ask jsonschema (which decides and says
what is wrong) only when it refuses, so its yes must always be jsonschema's yes.

fastjsonschema implements JSON Schema draft 7; the shipped schemas are 2020-12 but use only
keywords whose meaning is the same in draft 7, plus ``dependentRequired`` (2019-09), which is
rewritten as draft 7's array-valued ``dependencies`` (the same rule). A schema with any other
keyword (``prefixItems``, ``unevaluatedProperties``, ``$dynamicRef``, formats, ...) or a
reference outside ``#/$defs/`` is refused with :class:`Unsupported`, so a later edit of a
schema cannot make the check silently more lenient: the test suite compiles both shipped
schemas and compares the verdicts with jsonschema's on thousands of mutated documents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fastjsonschema

Check = Callable[[Any], bool]

DRAFT7 = "http://json-schema.org/draft-07/schema#"
# Keywords that only annotate: they never make a document invalid.
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description",
                         "default", "examples", "markdownDescription", "deprecated"})
# Keywords whose draft-7 meaning (what fastjsonschema implements) is the 2020-12 one.
KEYWORDS = frozenset({"type", "enum", "const", "properties", "required",
                      "additionalProperties", "items", "minItems", "maxItems", "minLength",
                      "maxLength", "minimum", "maximum", "exclusiveMinimum",
                      "exclusiveMaximum", "allOf", "anyOf", "oneOf", "not", "$ref", "pattern",
                      "patternProperties", "minProperties", "maxProperties", "uniqueItems",
                      "propertyNames", "dependentRequired", "if", "then", "else"}) | ANNOTATIONS
# Keywords whose value is a map of names to subschemas (the names are not keywords).
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs"})
DEFS = "#/$defs/"


class Unsupported(ValueError):
    """The schema uses something this check does not implement (use jsonschema)."""


def _draft7(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` as a draft-7 schema of the same meaning; :class:`Unsupported` otherwise."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise Unsupported(f"a schema that is a {type(node).__name__}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in KEYWORDS:
            raise Unsupported(f"keyword {key!r}")
        if key in ("$schema", "$id"):
            continue  # the draft is set at the top; an $id would move where $refs resolve
        if key == "$ref":
            if not (isinstance(value, str) and value.startswith(DEFS)
                    and value[len(DEFS):] in defs):
                raise Unsupported(f"$ref {value!r}")
            out[key] = value
        elif key == "items" and not isinstance(value, dict | bool):
            raise Unsupported("items as a list (draft 7's tuple form means prefixItems)")
        elif key in ("enum", "const") and any(
                isinstance(v, dict | list) for v in (value if key == "enum" else [value])):
            raise Unsupported(f"{key} of arrays or objects")
        elif key == "dependentRequired":
            out.setdefault("dependencies", {}).update(value)
        elif key in SCHEMA_MAPS:
            out[key] = {name: _draft7(sub, defs) for name, sub in value.items()}
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_draft7(sub, defs) for sub in value]
        elif key in ("additionalProperties", "not", "propertyNames", "items", "if", "then",
                     "else") and isinstance(value, dict | bool):
            out[key] = _draft7(value, defs)
        else:
            out[key] = value
    return out


def compile_schema(schema: Any) -> Check:
    """The check of ``schema`` (a dict or a boolean schema): True when the document is valid;
    :class:`Unsupported` if the schema uses a keyword or a reference this module cannot
    hand to fastjsonschema with its 2020-12 meaning."""
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    converted = _draft7(schema, defs)
    if isinstance(converted, dict):
        converted = {"$schema": DRAFT7, **converted}
    validate = fastjsonschema.compile(converted, use_formats=False, use_default=False)

    def check(doc: Any) -> bool:
        try:
            validate(doc)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return check
