"""The JSON Schema half of case-file validation: the schema shipped in the package, run over
the loaded document, each violation turned into a ``file:line:col`` message a person can act on
(the key path, what is allowed, a suggestion for a misspelt key).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

from .. import schemacheck
from ..errors import CaseFileError, quote
from .fields import suggest
from .load import Document, Path


@functools.cache
def case_schema() -> dict[str, Any]:
    """The JSON Schema of case files shipped in the package."""
    text = resources.files("harness").joinpath("schemas/case-file.schema.json").read_text()
    return dict(json.loads(text))


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    import jsonschema  # only to word what is wrong: 40 ms to import, off collection's path

    return jsonschema.Draft202012Validator(case_schema())


@functools.cache
def _check() -> schemacheck.Check:
    return schemacheck.compile_schema(case_schema())


def _jsonable(value: Any) -> Any:
    """Copy with every mapping key as a string (JSON Schema only knows string keys)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _doc_path(doc: Document, parts: tuple[Any, ...]) -> Path:
    """Map a jsonschema path (string keys) back onto the document's keys (ints for ranks)."""
    out: list[str | int] = []
    for p in parts:
        if isinstance(p, str) and p.isdigit() and (*out, int(p)) in doc.positions:
            out.append(int(p))
        else:
            out.append(p)
    return tuple(out)


def unknown_key(key: Any, allowed: list[str]) -> tuple[str, str]:
    """The message and hint for one unknown key (a "did you mean" when one is close)."""
    return (f"unknown key {quote(key, 80)}", suggest(str(key)[:80], allowed) if allowed else "")


def _schema_message(err: jsonschema.ValidationError) -> tuple[str, str]:
    """A short message and a hint for one schema error."""
    v = err.validator
    schema: dict[str, Any] = err.schema if isinstance(err.schema, dict) else {}
    if v == "additionalProperties":
        instance: Any = err.instance
        extras = [k for k in instance if k not in schema.get("properties", {})]
        return unknown_key(extras[0], sorted(schema.get("properties", {})))
    if v == "required":
        return (err.message.replace("is a required property", "is required here"), "")
    if v == "enum":
        return (f"{quote(err.instance, 80)} is not allowed",
                suggest(str(err.instance), [str(x) for x in schema.get("enum", [])]))
    if v == "anyOf" or v == "oneOf":
        inst = err.instance
        if isinstance(inst, str) and inst.lower() in ("yes", "no", "on", "off"):
            return (f"{inst!r} is a string here", "write true or false")
        # The branch that fits the value's type says what is wrong with it (a map's missing
        # key), not the branch of another type ("is not of type 'string'").
        shaped = [e for e in err.context or [] if e.validator not in ("type", "const")]
        from jsonschema.exceptions import best_match

        best = best_match(shaped) if shaped else None
        if best is not None and best.validator not in ("type", "anyOf"):
            return _schema_message(best)
        return (f"{_short(inst)} does not fit here", _expected_types(err))
    if v == "type":
        return (f"{_short(err.instance)} is not of type {err.validator_value}", "")
    if v == "dependentRequired" and isinstance(err.validator_value, dict):
        key = next((k for k in err.validator_value if isinstance(err.instance, dict)
                    and k in err.instance), "")
        needs = ", ".join(repr(n) for n in err.validator_value.get(key, ()))
        return (f"{key!r} needs {needs}", "without 'ranks' every rank must raise, so there "
                "are no other ranks to describe" if key == "others" else "")
    if v == "maxLength":
        return (f"{quote(err.instance, 60)} is longer than {err.validator_value} characters", "")
    if v == "uniqueItems":
        return (f"{_short(err.instance)} lists the same rank twice", "list each rank once")
    if v == "pattern" and isinstance(err.instance, str):
        return (f"{quote(err.instance, 80)} is not a valid name here",
                "use letters, digits, '_' (and '.', '-' in case names)")
    return (quote(err.message, 300)[1:-1], "")


def _expected_types(err: jsonschema.ValidationError) -> str:
    kinds: list[str] = []
    schema: dict[str, Any] = err.schema if isinstance(err.schema, dict) else {}
    for sub in schema.get("anyOf", schema.get("oneOf", [])):
        t = sub.get("type") or (repr(sub["const"]) if "const" in sub else
                                "a map" if "$ref" in sub else "")
        if isinstance(t, list):
            t = " or ".join(t)
        if t and t not in kinds:
            kinds.append(str(t))
    return "expected " + ", ".join(kinds) if kinds else ""


def _short(value: Any) -> str:
    return quote(value, 60)


def _deeper(err: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """The failure inside a value when only the branch of an ``anyOf`` that fits the map got
    that far (an unknown key in a program's ``expected: {t: {...}}``): said at that key, not
    "does not fit here" at the map."""
    while err.validator in ("anyOf", "oneOf") and err.context:
        deeper = [e for e in err.context if len(e.absolute_path) > len(err.absolute_path)
                  and e.validator not in ("type", "const")]
        if not deeper:
            break
        err = max(deeper, key=lambda e: len(e.absolute_path))
    return err


def schema_problems(doc: Document) -> list[tuple[CaseFileError, tuple[Any, ...], bool]]:
    """Schema violations with the raw document path each was found at, and whether it is an
    unknown key (which the rest of the checks can simply leave out)."""
    found: list[tuple[CaseFileError, tuple[Any, ...], bool]] = []
    data = _jsonable(doc.data)
    if _check()(data):  # the fast check's yes is final; a no is worded by jsonschema
        return found
    for err in map(_deeper, _validator().iter_errors(data)):
        path = _doc_path(doc, tuple(err.absolute_path))
        if err.validator == "additionalProperties":
            # One error per unknown key, each at its own line (jsonschema reports them as one).
            props = err.schema.get("properties", {}) if isinstance(err.schema, dict) else {}
            instance: Any = err.instance
            for extra in [k for k in instance if k not in props]:
                message, hint = unknown_key(extra, sorted(props))
                key_path = (*path, int(extra) if (*path, extra) not in doc.positions
                            and str(extra).isdigit() else extra)
                at = key_path if key_path in doc.positions else path
                found.append((doc.error(at, message, hint, at_key=at is key_path),
                              (*tuple(err.absolute_path), extra), True))
            continue
        message, hint = _schema_message(err)
        found.append((doc.error(path, message, hint), tuple(err.absolute_path), False))
    found.sort(key=lambda f: (f[0].pos.line, f[0].pos.col))
    return found
