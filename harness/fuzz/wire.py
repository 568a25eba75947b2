"""The messages between ``collective-fuzz`` and its lanes' worker processes: JSON lines.

JSON, never pickle: what a worker writes can only ever be data to the coordinator, checked
here against a schema per kind (types, bounds, lengths, patterns) before anything reads it.
A line is at most :data:`MAX_LINE` bytes; anything else is a :class:`BadMessage`, which the
coordinator reports in one line (and ends that worker), never a traceback.

Worker -> coordinator: ``warning`` (a ``--known`` file that did not load; lane 0 only),
``ready`` (warm and waiting for ``go``; only when asked), ``progress`` (the lane's tally,
about once a second, and a note when something happens), ``ran`` (one instance's output
digests, only with ``--report``), ``finding``, ``also`` (bad on the confirming backend too),
``end`` (the final tally and CPU time). Coordinator -> worker: ``config`` (first),
``go``, ``skip`` (a signature another lane found), ``stop``.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from jsonschema import validators

MAX_LINE = 1 << 20
TEXT = 1 << 18  # a generated case document, far larger than any the fuzzer draws
SIG = {"type": "string", "pattern": r"^[A-Za-z0-9_]{1,64}:[a-z-]{1,32}$"}
NAME = {"type": "string", "maxLength": 300}
LINE = {"type": "string", "maxLength": 4000}
COUNT = {"type": "integer", "minimum": 0}
SECONDS = {"type": "number", "minimum": 0}
HEX = {"type": "string", "pattern": r"^[0-9a-f]{1,64}$"}


def _map(values: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "maxProperties": 10000, "propertyNames": {"maxLength": 300},
            "additionalProperties": values}


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


TALLY = _obj({"tried": COUNT, "shrinking": COUNT, "invalid": COUNT, "repeats": COUNT,
              "confirm_runs": COUNT, "compared": COUNT, "by_op": _map(COUNT),
              "outcomes": _map(COUNT), "absorbed": _map(COUNT),
              "reasons": _map({"type": "string", "maxLength": 200}), "also": _map(COUNT)})
SCHEMAS: dict[str, dict[str, Any]] = {
    "config": _obj({"argv": {"type": "array", "maxItems": 1000, "items": LINE},
                    "lane": COUNT, "lanes": {"type": "integer", "minimum": 1},
                    "examples": {"anyOf": [COUNT, {"type": "null"}]},
                    "warm": {"type": "boolean"}}),
    "go": _obj({}),
    "stop": _obj({}),
    "skip": _obj({"signature": SIG}),
    "warning": _obj({"text": LINE}),
    "ready": _obj({}),
    "progress": _obj({"tally": TALLY, "note": LINE}),
    "ran": _obj({"key": {**HEX, "pattern": r"^[0-9a-f]{64}$"},
                 "digests": {**_map(HEX), "maxProperties": 4096,
                             "propertyNames": {"pattern": r"^[0-9]{1,3}/[A-Za-z0-9_.]{1,64}$"}}}),
    # op and outcome name the case file: short, and nothing a path could be made of
    "finding": _obj({"signature": SIG, "op": {"type": "string", "pattern": r"^[A-Za-z0-9_]{1,64}$"},
                     "outcome": {"type": "string", "pattern": r"^[a-z-]{1,32}$"},
                     "text": {"type": "string", "maxLength": TEXT}, "message": LINE,
                     "seed": COUNT, "blob": {"type": "string", "maxLength": 1 << 16},
                     "found_after_s": SECONDS, "found_after_examples": COUNT,
                     "shrink_s": SECONDS, "exception": NAME}),
    "also": _obj({"signature": SIG, "text": {"type": "string", "maxLength": TEXT},
                  "message": LINE, "confirm_outcome": NAME, "confirm_message": LINE}),
    "end": _obj({"tally": TALLY, "interrupted": {"type": "boolean"}, "cpu_s": SECONDS,
                 "ranks_cpu_s": SECONDS, "pools_started": COUNT}),
}
# An integer is an int: JSON Schema's "integer" also takes 2.0, which would print as "2.0
# instances" and break the counters' arithmetic.
_Validator = validators.extend(  # type: ignore[no-untyped-call]  # (the stubs lack it)
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool)))
_VALIDATORS = {kind: _Validator(schema) for kind, schema in SCHEMAS.items()}


class BadMessage(ValueError):
    """A line that is not a well-formed message (one line, for the terminal)."""


def encode(kind: str, **fields: Any) -> bytes:
    """One message as a line (ValueError if it would pass :data:`MAX_LINE`)."""
    line = json.dumps({"kind": kind, **fields}, allow_nan=False, separators=(",", ":"))
    if len(line) >= MAX_LINE:
        raise ValueError(f"a {kind!r} message of {len(line)} bytes passes the {MAX_LINE} limit")
    return line.encode("ascii") + b"\n"


def _no_constant(name: str) -> Any:
    raise BadMessage(f"{name} is not a JSON number")


def decode(line: bytes) -> tuple[str, dict[str, Any]]:
    """The kind and fields of one line (its newline included or not); BadMessage if it is
    not a message of a known kind with every field as its schema says."""
    if len(line) > MAX_LINE:
        raise BadMessage(f"a line of more than {MAX_LINE} bytes")
    try:
        obj = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadMessage(f"not JSON ({type(exc).__name__}: {str(exc)[:100]})") from None
    if not isinstance(obj, dict) or obj.get("kind") not in SCHEMAS:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        raise BadMessage(f"not a message of a known kind ({str(kind)[:60]!r})")
    kind = obj.pop("kind")
    error = jsonschema.exceptions.best_match(_VALIDATORS[kind].iter_errors(obj))
    if error is not None:
        where = "/".join(str(p)[:60] for p in error.absolute_path) or "the message"
        raise BadMessage(f"{kind!r} message: at {where}: {error.message[:200]}")
    return str(kind), obj
