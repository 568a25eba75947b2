"""Differential mode: the same generated instances compared bit for bit elsewhere.

``--against NAME`` runs every passing (or uncheckable) instance once more on backend NAME in
the same process (its own pools) and compares the output digests; ``--report PATH`` writes
the digests of
every instance of a run, keyed by the document's SHA-256, and ``--against-report PATH`` reads
such a report (another torch's run of the same seed) and compares. Where the reference
accepts more than one answer (float reductions of random data within a tolerance), a
different rounding between two backends or releases is a finding all the same.

The report read back is hostile input: read only as a regular file of at most
:data:`MAX_BYTES` (:func:`harness.report.jsonfile.read_json`: a FIFO or ``/dev/zero`` is
refused before a byte is read; duplicated keys, deep nesting and integers past Python's digit
limit are refused too), every field type- and length-checked; a bad one is a one-line error
naming the file, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from ..report.jsonfile import UnreadableFile, printable, read_json
from .execute import Executor, Ran

SCHEMA = "collective-fuzz-digests/1"
MAX_BYTES = 64 << 20
MAX_INSTANCES = 1_000_000
HEX = re.compile(r"^[0-9a-f]{1,64}$")
KEY = re.compile(r"^[0-9]{1,3}/[A-Za-z0-9_.]{1,64}$")


class BadReport(ValueError):
    """A digests report that cannot be trusted (one line, for the terminal)."""


def text_key(text: str) -> str:
    """The key of a generated document."""
    return hashlib.sha256(text.encode()).hexdigest()


def compare(mine: dict[str, str], theirs: dict[str, str], label: str) -> str:
    """"" when the digests agree, else what differs."""
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if not diff:
        return ""
    k = diff[0]
    return (f"outputs differ bit for bit from {label}: {len(diff)} buffer(s), first rank/tensor "
            f"{k}: here {mine.get(k, 'missing')}, there {theirs.get(k, 'missing')}")


def load_digests(path: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The digests by document key, and the run's metadata; BadReport if it is not one."""
    try:
        doc = read_json(path, "digests report", max_bytes=MAX_BYTES)
    except UnreadableFile as exc:
        raise BadReport(str(exc)) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise BadReport(f"{path} is not a collective-fuzz digests report (schema {SCHEMA})")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) < 200
            for k, v in meta.items()):
        raise BadReport(f"{path}: 'meta' must map names to short strings")
    items = doc.get("instances")
    if not isinstance(items, dict) or len(items) > MAX_INSTANCES:
        raise BadReport(f"{path}: 'instances' must be an object of at most {MAX_INSTANCES}")
    out: dict[str, dict[str, str]] = {}
    for key, digests in items.items():
        if not (isinstance(key, str) and HEX.match(key) and isinstance(digests, dict)
                and len(digests) <= 4096
                and all(isinstance(k, str) and KEY.match(k) and isinstance(v, str)
                        and HEX.match(v) for k, v in digests.items())):
            raise BadReport(f"{path}: instance {printable(repr(key), 80)} is malformed (a hex "
                            "key, and 'rank/tensor' -> hex digest)")
        out[key] = digests
    return out, meta


def write_digests(path: str, digests: dict[str, dict[str, str]], meta: dict[str, str]) -> None:
    """Write a digests report atomically."""
    doc: dict[str, Any] = {"schema": SCHEMA, "meta": meta, "instances": digests}
    tmp = f"{path}.tmp{os.getpid()}"
    Path(tmp).write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


# Outcomes whose outputs are compared: a pass, and an instance whose reference accepts more
# than one answer and gives no bound to judge it by (float reductions of random data over
# three or more ranks) -- exactly where two backends or releases may round differently.
COMPARABLE = ("passed", "uncheckable")


class Differ:
    """Compares a passing instance's digests with another backend's or a report's."""

    def __init__(self, other: Executor | None = None,
                 report: dict[str, dict[str, str]] | None = None, label: str = "") -> None:
        self.other = other
        self.report = report or {}
        self.label = label
        self.compared = 0

    def check(self, text: str, ran: Ran) -> str:
        """What differs ("" when nothing or nothing comparable)."""
        if ran.outcome not in COMPARABLE or not ran.digests:
            return ""
        if self.other is not None:
            there = self.other.run_text(text)
            if there.outcome not in COMPARABLE:
                return ""  # the other side's own verdict is its business
            self.compared += 1
            return compare(ran.digests, there.digests, self.label)
        theirs = self.report.get(text_key(text))
        if theirs is None:
            return ""
        self.compared += 1
        return compare(ran.digests, theirs, self.label)
