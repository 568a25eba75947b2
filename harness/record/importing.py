"""What one imported file yields, and the checks every importer shares.

An importer (:mod:`harness.record.flightrec`, :mod:`harness.record.exectrace`) turns one
rank's file into an :class:`Imported`: the calls in the case vocabulary, the ops it could not
translate (named, never dropped), what the format does not record, and what cannot be
replayed. Sizes are checked here so a hostile file cannot ask for absurd shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.record.optable import Call
from harness.record.plaindata import Refused, json_value
from harness.record.trace import TraceError, short

MAX_ENTRIES = 1_000_000
# Every rank, group size and world size a file states, or its name gives: checked before a
# group is built from it.
MAX_RANKS = 1 << 20
# The calls of one import, each counted by the size of its group: writing the cases costs that
# much (signatures, world checks), so it is bounded before the cases are written.
MAX_CALL_RANKS = 1 << 32
MAX_DIMS = 16
MAX_DIM = 1 << 40

# c10 ScalarType names (Flight Recorder) and C++ type names (execution traces) -> case dtypes
DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
    "Bool": "bool",
    "float": "float32", "double": "float64", "c10::Half": "float16",
    "c10::BFloat16": "bfloat16", "long int": "int64", "int64_t": "int64", "int": "int32",
    "short int": "int16", "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
}


@dataclass
class Imported:
    """One rank's file, translated."""

    kind: str  # "Flight Recorder dump" or "execution trace"
    rank: int
    world_size: int  # 0: the file does not say
    calls: list[Call] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # "file: entry N: why", one per op
    lacks: list[str] = field(default_factory=list)  # what the format does not record
    not_replayed: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)


def embedded_json(at: str, text: Any, what: str) -> Any:
    """The JSON a string field holds (torch writes group lists so), bounded like a file."""
    if not isinstance(text, str):
        raise TraceError(f"{at}: {what} is not a string of JSON")
    try:
        return json_value(text)
    except Refused as e:
        raise TraceError(f"{at}: {what} {short(text, 40)}: {e}") from None


def rank_list(at: str, value: Any, what: str) -> list[int]:
    """A list of at most MAX_RANKS ranks, each below MAX_RANKS."""
    if not (isinstance(value, list) and len(value) <= MAX_RANKS
            and all(type(r) is int and 0 <= r < MAX_RANKS for r in value)):
        raise TraceError(f"{at}: {what} is not a list of at most {MAX_RANKS} ranks below "
                         f"{MAX_RANKS}")
    return value


def where(path: Path, index: int, extra: str = "") -> str:
    """``file: entry N (extra)`` for messages."""
    return f"{path}: entry {index}" + (f" ({extra})" if extra else "")


def shape(at: str, value: Any, what: str) -> tuple[int, ...]:
    """A checked shape: a list of at most MAX_DIMS integers in [0, MAX_DIM]."""
    if not isinstance(value, list) or len(value) > MAX_DIMS:
        raise TraceError(f"{at}: {what} is not a shape (a list of at most {MAX_DIMS} sizes)")
    for d in value:
        if type(d) is not int or not 0 <= d <= MAX_DIM:
            raise TraceError(f"{at}: {what} has a size {str(d)[:30]!s} outside 0..2**40")
    return tuple(value)


def dtype(at: str, name: Any) -> str:
    """A case dtype from a recorded dtype name; TraceError for one the harness lacks."""
    if not isinstance(name, str):
        raise TraceError(f"{at}: dtype {str(name)[:30]!r} is not a name")
    try:
        return DTYPES[name]
    except KeyError:
        raise TraceError(f"{at}: dtype {name[:40]!r} is not one the harness runs") from None


def check_count(path: Path, items: Any, what: str) -> list[Any]:
    """The list of entries/nodes, bounded."""
    if not isinstance(items, list):
        raise TraceError(f"{path}: '{what}' is not a list")
    if len(items) > MAX_ENTRIES:
        raise TraceError(f"{path}: {len(items)} {what}, more than the {MAX_ENTRIES} an import "
                         "reads")
    return items
