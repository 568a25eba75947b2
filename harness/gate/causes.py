"""Failures grouped by cause, so that a gate with a thousand regressions reads as a few causes.

A backend that rejects one op fails every instance of it the same way: the gate's list of
1,438 regressions was a handful of causes repeated. Each failing instance gets a *cause key*:
the exception a rank raised (its type and the first line of its message) when the record has
one, else the first line of its verdict (:func:`harness.report.oneline.one_line`), either way
with what differs from one instance to the next made general: numbers (sizes, ranks, values,
seconds), paths and hex addresses. Instances with the same key form a group;
groups are listed largest first, each with its count and a few example instances.

Takes report records (for the key) and the gate's changes (to group). Gives plain data; the
renderers in :mod:`harness.gate.compare` print it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

EXAMPLES = 3  # example instances shown per group
CAUSE_CHARS = 200

_NORMALISE = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),  # addresses, handles
    (re.compile(r"(?<![\w.])(?:/[\w.@+-]+)+/?"), "<path>"),  # absolute paths
    (re.compile(r"\b[\w.@+-]+(?:/[\w.@+-]+)+"), "<path>"),  # relative ones (a/b.yaml)
    # numbers standing alone (not the 32 of float32 or the 4 of ws4)
    (re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?!\w)"), "N"),
    (re.compile(r"\s+"), " "),
)


def normalise(text: str) -> str:
    """``text`` with what varies between instances of one cause made general, on one line."""
    out = text
    for pattern, repl in _NORMALISE:
        out = pattern.sub(repl, out)
    out = out.strip()
    return out if len(out) <= CAUSE_CHARS else out[:CAUSE_CHARS - 1] + "…"


def cause_of(record: dict[str, Any], reason: str) -> str:
    """The cause key of a report record: the first exception a rank raised (type: message's
    first line), else ``reason`` (the record's one-line verdict), normalised."""
    for rank in record.get("ranks") or []:
        exc = rank.get("exception") if isinstance(rank, dict) else None
        if isinstance(exc, dict) and exc.get("type"):
            lines = str(exc.get("message") or "").strip().splitlines()
            return normalise(f"{exc['type']}: {lines[0] if lines else ''}".rstrip(": "))
    return normalise(reason)


class Grouped(Protocol):
    """What :func:`group` needs of a change."""

    @property
    def cause(self) -> str: ...

    @property
    def reason(self) -> str: ...


@dataclass(frozen=True)
class Group:
    """The instances of one cause, in the order they came."""

    cause: str
    items: Sequence[Any]

    def examples(self, n: int = EXAMPLES) -> Sequence[Any]:
        return self.items[:n]


def group(changes: Iterable[Grouped]) -> list[Group]:
    """Changes grouped by cause key (a change without one: its reason, normalised), largest
    group first, then by key."""
    by: dict[str, list[Any]] = {}
    for c in changes:
        by.setdefault(c.cause or normalise(c.reason) or "(no reason given)", []).append(c)
    return [Group(k, v) for k, v in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
