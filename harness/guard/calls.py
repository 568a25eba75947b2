"""A sampled call once its digests exist: what the checker publishes, needs and decides.

Calls come from two places. The C++ kernel digests dense CPU calls itself and hands the
checker plain records (:func:`from_native`): the digests, the facts the spec needs and a
reference to the call's arguments and site, from which the call's case JSON and site text are
made only if the call is found wrong (:meth:`Entry.describe`). The Python path (CUDA, other
layouts, the Python kernel, a Python ProcessGroup) builds an :class:`Item` with torch digests
that may still be on their way (:func:`from_item` once they landed).

The key a call's digests are filed under on the side channel is the same on every rank that
takes part: (group, op family, sequence number) for a collective, and for a point-to-point
message (group, "p2p", sender, receiver, tag, sequence number of that pair's messages).
"""

from __future__ import annotations

import functools
import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.guard import digest
from harness.guard.plan import CHECKED, Plan, spec_of
from harness.record.capture import GROUP, call_json, site_json

Key = tuple[Any, ...]

Raw = tuple[str, int, bytes]  # a digest: kind ("d" float64, "q" int64), columns, the numbers


def raw(rows: list[list[Any]] | Raw) -> Raw:
    """A digest (rows of int64 or float64, or already raw: the C++ kernel's form) as its kind,
    columns and little-endian numbers."""
    if isinstance(rows, tuple):
        return rows
    if not rows:
        return ("q", 0, b"")
    kind = "d" if isinstance(rows[0][0], float) else "q"
    flat = [v for row in rows for v in row]
    return (kind, len(rows[0]), struct.pack(f"<{len(flat)}{kind}", *flat))


def rows_of(d: list[list[Any]] | Raw) -> list[list[Any]]:
    """A raw digest's rows (a digest already in rows as it is)."""
    if not isinstance(d, tuple):
        return d
    kind, cols, data = d
    flat = list(struct.unpack(f"<{len(data) // 8}{kind}", data))
    return [flat[i:i + cols] for i in range(0, len(flat), cols)] if cols else []


@dataclass
class Item:
    """A sampled call of the Python path on its way to the checker (digests may not have
    landed yet)."""

    name: str
    seq: int
    plan: Plan
    pending: digest.Pending | None
    call: str  # the call's JSON (the recorder's format), for the finding's case
    site: str
    gname: str
    me: int  # this rank's position in the group
    ordinal: int = 0
    step: int = 0
    kept: list[torch.Tensor] = field(default_factory=list)
    landed: threading.Event | None = None  # set once a completion callback took the digests

    def ready(self) -> bool:
        """Whether its digests exist on the host (never blocks)."""
        if self.landed is not None and not self.landed.is_set():
            return False
        return self.pending is None or self.pending.ready()


@dataclass
class Entry:
    """A sampled call with its digests, ready to be published and decided."""

    name: str  # the dispatcher op
    seq: int
    gname: str
    spec: dict[str, Any]
    me: int  # this rank's position in the group
    rows_in: list[Any]
    rows_out: list[Any]
    ordinal: int  # the call's number among this rank's calls of the checked ops
    step: int  # optimizer steps this process had taken when the call was issued
    describe: Callable[[], tuple[dict[str, Any], str]]  # (call, site): made on a finding
    kept: Callable[[], list[torch.Tensor]]  # inputs kept by --keep-inputs ([]: none)
    since: float = 0.0  # when the checker took it (for its timeout)
    _needs: list[int] | None = None
    _key: Key | None = None  # (the checker asks these of each entry several times)

    @property
    def rank(self) -> int:
        """This rank's global rank."""
        return int(self.spec["group"][self.me])

    @functools.cached_property
    def family(self) -> str:
        """The op family (all_reduce, p2p, ...)."""
        return CHECKED[self.name][0]

    def mine(self, raw_only: bool = False) -> dict[str, Any]:
        """This rank's digests as the checker compares them: as rows, or (``raw_only``) raw
        (see :mod:`harness.guard.channel`)."""
        conv = raw if raw_only else rows_of
        return {"rank": self.rank, "in": [conv(d) for d in self.rows_in],
                "out": [conv(d) for d in self.rows_out]}

    def key(self) -> Key:
        """What its digests are filed under on the side channel (the same on every rank)."""
        if self._key is not None:
            return self._key
        if self.family != "p2p":
            self._key = (self.gname, self.family, self.seq)
            return self._key
        peer = int(self.spec["group"][self.spec["peer"]])
        sender, receiver = (self.rank, peer) if self.name == "send" else (peer, self.rank)
        self._key = (self.gname, "p2p", sender, receiver, int(self.spec["tag"]), self.seq)
        return self._key

    def needs(self) -> list[int]:
        """The global ranks whose digests decide it (none for a send: its receiver decides)."""
        if self._needs is None:
            if self.family == "p2p":
                self._needs = ([] if self.name == "send"
                               else [int(self.spec["group"][self.spec["peer"]])])
            else:
                self._needs = [int(r) for r in self.spec["group"] if int(r) != self.rank]
        return self._needs

    def sends_to(self) -> list[int]:
        """The global ranks its digests go to."""
        if self.family == "p2p":
            return [int(self.spec["group"][self.spec["peer"]])] if self.name == "send" else []
        return self.needs()


_SPECS: dict[tuple[Any, ...], dict[str, Any]] = {}


def from_native(native: Any, rec: tuple[Any, ...]) -> Entry:
    """A record the C++ kernel digested (see guard.cpp's take) as an entry."""
    (name, seq, gname, ranks, me, dtype, chunk, reduce, root, peer, tag, ordinal, step,
     rows_in, rows_out, ref) = rec
    facts = (name, ranks, dtype, chunk, reduce, root, peer, tag)
    spec = _SPECS.get(facts)
    if spec is None:  # one spec per distinct call shape, shared by its entries (read only)
        if len(_SPECS) > 4096:
            _SPECS.clear()
        spec = _SPECS[facts] = spec_of(name, [int(r) for r in ranks], dtype, int(chunk),
                                       int(reduce), int(root), int(peer), int(tag))
    group = spec["group"]

    def describe() -> tuple[dict[str, Any], str]:
        op, args, api, code, line = native.guard_describe(ref)
        captured = tuple((arg, (GROUP, tuple(group)) if tag_ == GROUP else (tag_, payload))
                         for arg, (tag_, payload) in args)
        call = json.loads(call_json(str(op), captured, api) + "}")
        site = json.loads(site_json(None if code is None else (code, int(line))))
        return call, str(site)

    return Entry(str(name), int(seq), str(gname), spec, int(me), rows_in, rows_out, int(ordinal),
                 int(step), describe, lambda: list(native.guard_kept(ref)))


def from_item(item: Item) -> Entry:
    """A Python-path item whose digests landed (:meth:`Item.ready`) as an entry."""
    rows = digest.as_lists(item.pending) if item.pending is not None else []
    nin = len(item.plan.before)
    return Entry(item.name, item.seq, item.gname, item.plan.spec, item.me, rows[:nin], rows[nin:],
                 item.ordinal, item.step,
                 lambda: (json.loads(item.call + "}"), str(json.loads(item.site))),
                 lambda: list(item.kept))
