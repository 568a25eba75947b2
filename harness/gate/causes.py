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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..report.oneline import normalise

EXAMPLES = 3  # example instances shown per group


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
