"""A rank's result as a file in the state directory: JSON, checked field by field on load.

External-ranks mode keeps each rank's result of the round in flight on disk (``pending``), so
that a relaunch can judge an instance whose other ranks hung or died. The README asks for a
state directory every node shares, so anyone who can write there could put a file in it: the
format is plain JSON (no pickle: reading it cannot run code), and :func:`load_result` accepts
only what a :class:`~harness.model.RankResult` can hold, each field of the type the dataclass
declares; anything else is a :class:`ResultFileError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from ..model import RankResult, StepEvent, TensorCheck
from ..report.jsonfile import UnreadableFile, read_json

MAX_BYTES = 64 * 1024 * 1024  # a result holds digests and the first wrong values, not tensors
MAX_DEPTH = 40  # ordering/perf/timing dicts are shallow; deep nesting is not a result


class ResultFileError(ValueError):
    """A result file that is not a rank's result; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Pending:
    """A rank's result of one round: the global rank, the round, the instance (its index in
    the run), the result and the seconds the instance took on that rank."""

    rank: int
    round: int
    index: int
    elapsed: float
    result: RankResult


def dump_result(p: Pending) -> bytes:
    """The file's bytes."""
    doc = {"format": "collective-harness rank result", "version": 1, "rank": p.rank,
           "round": p.round, "index": p.index, "elapsed": p.elapsed,
           "result": dataclasses.asdict(p.result)}
    return json.dumps(doc, ensure_ascii=True, allow_nan=True).encode()


def load_result(path: Path) -> Pending:
    """The :class:`Pending` result in ``path``; :class:`ResultFileError` if it is not one.

    Never runs code from the file and never trusts a field's type: a tampered or truncated
    file cannot turn into a result it does not hold."""
    try:
        # Checked before reading: the shared reader's bound is a whole report's, not a rank's.
        if path.is_file() and path.stat().st_size > MAX_BYTES:
            raise ResultFileError(f"{path}: larger than {MAX_BYTES} bytes")
        doc = read_json(str(path), "rank result")
    except (UnreadableFile, OSError) as exc:
        why = str(exc).removeprefix(f"{path}: ")
        raise ResultFileError(f"{path}: not a readable result file ({why[:160]})") from None
    if not isinstance(doc, dict) or doc.get("format") != "collective-harness rank result":
        raise ResultFileError(f"{path}: not a collective-harness rank result")
    for key, kind in (("rank", int), ("round", int), ("index", int), ("elapsed", float)):
        _check(doc.get(key), kind, f"{path}: {key}", 0)
    return Pending(doc["rank"], doc["round"], doc["index"], float(doc["elapsed"]),
                   _build(RankResult, doc.get("result"), f"{path}: result", 0))


def _build(cls: Any, value: Any, where: str, depth: int) -> Any:
    """An instance of dataclass ``cls`` from a JSON object, every field type-checked."""
    if not isinstance(value, dict):
        raise ResultFileError(f"{where}: expected an object, got {type(value).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ResultFileError(f"{where}: unknown field {unknown[0]!r}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in value:
            if (f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING):
                raise ResultFileError(f"{where}: missing field {name!r}")
            continue
        kwargs[name] = _check(value[name], hints[name], f"{where}.{name}", depth + 1)
    return cls(**kwargs)


def _check(value: Any, kind: Any, where: str, depth: int) -> Any:
    """``value`` converted to ``kind`` (dataclasses built, tuples made), or an error."""
    if depth > MAX_DEPTH:
        raise ResultFileError(f"{where}: nested too deeply")
    origin = typing.get_origin(kind)
    if kind is Any:
        _check_json(value, where, depth)
        return value
    if kind in (TensorCheck, StepEvent):
        return _build(kind, value, where, depth)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(kind):
            try:
                return _check(value, option, where, depth)
            except ResultFileError:
                continue
        raise ResultFileError(f"{where}: {_kind_of(value)} is none of {kind}")
    if origin is Literal:
        if value not in typing.get_args(kind):
            raise ResultFileError(f"{where}: {str(value)[:40]!r} is not one of "
                                  f"{typing.get_args(kind)}")
        return value
    if origin is list:
        (item,) = typing.get_args(kind)
        if not isinstance(value, list):
            raise ResultFileError(f"{where}: expected a list, got {_kind_of(value)}")
        return [_check(v, item, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(kind)
        if not isinstance(value, list) or len(value) != len(args):
            raise ResultFileError(f"{where}: expected a list of {len(args)}")
        return tuple(_check(v, a, f"{where}[{i}]", depth + 1)
                     for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ResultFileError(f"{where}: expected an object, got {_kind_of(value)}")
        _check_json(value, where, depth)
        return value
    if kind is type(None):
        if value is not None:
            raise ResultFileError(f"{where}: expected null, got {_kind_of(value)}")
        return None
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ResultFileError(f"{where}: expected a number, got {_kind_of(value)}")
        return float(value)
    if kind in (int, str, bool):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ResultFileError(f"{where}: expected {kind.__name__}, got {_kind_of(value)}")
        return value
    raise ResultFileError(f"{where}: cannot check a field of type {kind}")


def _check_json(value: Any, where: str, depth: int) -> None:
    """Plain JSON data of bounded depth (free-form fields: ordering, perf, timing)."""
    if depth > MAX_DEPTH:
        raise ResultFileError(f"{where}: nested too deeply")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_json(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]", depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        return  # timings may be nan/inf; json writes them as NaN/Infinity
    elif value is not None and not isinstance(value, bool | int | float | str):
        raise ResultFileError(f"{where}: {_kind_of(value)} is not JSON data")


def _kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__
