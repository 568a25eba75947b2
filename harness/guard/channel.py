"""The side channel: digests exchanged in batches over the job's own c10d store.

Each rank has an inbox on the store. The checker publishes the calls it took in one message
per peer that needs them (all of them, as JSON: never pickle) and reads its own inbox without
blocking, keeping what arrived until its own call of the same key is there to be decided. So a
batch of calls costs one push per peer and one pop per message that arrived, instead of a set,
a wait, a get, an add and deletes per call; and a pop removes what it read, so nothing is left
to tidy up. Stores with queues (TCPStore, HashStore) hold the inbox as a queue; others
(FileStore) as numbered keys, read and deleted in order.

Digests travel as base64 of their int64 or float64 numbers inside the JSON (exact bits,
and a fraction of the cost of JSON's float text, which was a third of the checker's time).
They stay raw (kind, columns, bytes: the C++ kernel hands them over so) from the kernel to the
wire and from the wire to the check: an honest call is decided on the bytes
(:func:`harness.guard.check.honest`), and only a call that is not has its numbers read.

The checker has its own connection to the store where the store can be cloned (TCPStore), so
that its waits never queue behind the training thread's use of the store.
"""

from __future__ import annotations

import binascii
import contextlib
import json
import struct
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from harness.guard.calls import Entry, Key, Raw, raw, rows_of

PREFIX = "collective-guard/"
MAX_HELD = 1 << 17  # peers' digests kept for calls this rank has not taken yet


class ChannelError(RuntimeError):
    """What came over the channel is not what a guard sends, or too much of it piled up."""


def open_store(timeout_s: float) -> Any:
    """The checker's store: the job's own (a clone of it where it can be cloned), under a
    prefix of ours."""
    base: Any = dist.distributed_c10d._get_default_store()
    # Where it cannot be cloned it is shared with the training thread: operations take turns.
    with contextlib.suppress(RuntimeError, NotImplementedError, AttributeError):
        base = base.clone()
    store = c10d.PrefixStore(PREFIX, base)
    store.set_timeout(timedelta(seconds=timeout_s))
    return store


class Inbox:
    """This rank's inbox and the way to reach the others'."""

    def __init__(self, store: Any, me: int) -> None:
        self.store = store
        self.me = me
        self.next = 1  # keyed inbox: the number of the next message to read
        try:
            store.queue_len(f"in/{me}")
            self.queues = True
        except NotImplementedError:
            self.queues = False

    def push(self, rank: int, text: str) -> None:
        """Leave ``text`` in ``rank``'s inbox."""
        if self.queues:
            self.store.queue_push(f"in/{rank}", text)
            return
        n = self.store.add(f"in/{rank}/n", 1)
        self.store.set(f"in/{rank}/{n}", text)

    def pop(self) -> str | None:
        """The oldest message in this rank's inbox, or None (never blocks)."""
        if self.queues:
            try:
                got = self.store.queue_pop(f"in/{self.me}", False)
            except dist.QueueEmptyError:
                return None
        else:
            key = f"in/{self.me}/{self.next}"
            if not self.store.check([key]):
                return None
            got = self.store.get(key)
            self.store.delete_key(key)
            self.next += 1
        return bytes(got).decode("utf-8") if not isinstance(got, str) else got


def pack(rows: list[list[Any]] | Raw) -> list[Any]:
    """One digest as [kind, columns, base64 of the numbers]: exact bits, and a fraction of the
    JSON float text's cost."""
    kind, cols, data = raw(rows)
    return [kind, cols, binascii.b2a_base64(data, newline=False).decode("ascii")]


def unraw(packed: list[Any]) -> Raw:
    """A digest :func:`pack` packed, raw (ValueError, TypeError or binascii.Error if
    malformed)."""
    kind, cols, text = packed
    if kind not in ("d", "q") or type(cols) is not int or cols < 0 or len(text) > 1 << 24:
        raise ValueError("not a packed digest")
    data = binascii.a2b_base64(text, strict_mode=True)
    if len(data) % 8 or (len(data) // 8 % cols if cols else data):
        raise ValueError("a packed digest's numbers do not fill its rows")
    return (kind, cols, data)


def unpack(packed: list[Any]) -> list[list[Any]]:
    """The rows :func:`pack` packed (ValueError, TypeError or binascii.Error if malformed)."""
    return rows_of(unraw(packed))


class Exchange:
    """Publishing this rank's digests, and holding the peers' until they are needed."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.held: dict[tuple[Key, int], dict[str, Any]] = {}
        self.pushes = 0
        self.pops = 0

    def publish(self, entries: list[Entry]) -> None:
        """Send each peer, in one message, the digests of these calls it needs."""
        out: dict[int, list[Any]] = {}
        for e in entries:
            packed = None
            for rank in e.sends_to():
                packed = packed or [list(e.key()), [pack(d) for d in e.rows_in],
                                    [pack(d) for d in e.rows_out]]
                out.setdefault(rank, []).append(packed)
        for rank, items in out.items():
            self.inbox.push(rank, json.dumps({"from": self.inbox.me, "d": items}))
            self.pushes += 1

    def collect(self) -> int:
        """Read every message waiting in this rank's inbox; how many there were."""
        n = 0
        while (text := self.inbox.pop()) is not None:
            n += 1
            self.pops += 1
            try:
                msg = json.loads(text)
                sender = int(msg["from"])
                for key, rows_in, rows_out in msg["d"]:
                    self.held[(tuple(key), sender)] = {  # raw until a check needs the rows
                        "rank": sender, "in": [unraw(d) for d in rows_in],
                        "out": [unraw(d) for d in rows_out]}
            except (ValueError, KeyError, TypeError, binascii.Error, struct.error) as exc:
                raise ChannelError(f"a message in this rank's inbox is not the guard's "
                                   f"({type(exc).__name__})") from None
            if len(self.held) > MAX_HELD:
                raise ChannelError(f"more than {MAX_HELD} peers' digests are waiting for calls "
                                   "this rank has not made (do the ranks issue the same calls?)")
        return n

    def ready(self, e: Entry) -> bool:
        """Whether every peer's digests of ``e`` arrived."""
        key = e.key()
        return all((key, r) in self.held for r in e.needs())

    def missing(self, e: Entry) -> list[int]:
        """The peers whose digests of ``e`` have not arrived."""
        key = e.key()
        return [r for r in e.needs() if (key, r) not in self.held]

    def digests(self, e: Entry, raw_only: bool = False) -> list[dict[str, Any]]:
        """Every rank's digests of ``e`` in group order (a p2p call: sender, receiver), taken
        out of what is held: as rows, or (``raw_only``) raw, for :func:`check.honest`."""
        key = e.key()
        if e.family == "p2p":
            got = [self.held.pop((key, e.needs()[0])), e.mine(raw_only=True)]
        else:
            got = [e.mine(raw_only=True) if int(r) == e.rank else self.held.pop((key, int(r)))
                   for r in e.spec["group"]]
        return got if raw_only else [as_rows(d) for d in got]


def as_rows(d: dict[str, Any]) -> dict[str, Any]:
    """One rank's raw digests (:meth:`Exchange.digests`) with their rows, as the checks read
    them."""
    return {"rank": d["rank"], "in": [rows_of(x) for x in d["in"]],
            "out": [rows_of(x) for x in d["out"]]}
