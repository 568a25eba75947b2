"""One-line reasons for report records, shared by the gate, the certificate and the HTML
report, and their cause keys: the reason with what varies between instances of one root
cause (numbers, paths, addresses) made general, so that hundreds of results read as one."""

from __future__ import annotations

import re
from typing import Any


def one_line(record: dict[str, Any], limit: int = 300) -> str:
    """A one-line reason for a record's outcome, without the ``file:line: case[id]:`` prefix
    (the gate prints the instance beside it)."""
    if record.get("outcome") == "skipped" and record.get("reason"):
        return str(record["reason"])[:limit]
    lines = [ln.strip() for ln in (record.get("message") or "").splitlines() if ln.strip()]
    if lines and lines[0].startswith("expected failure (") and len(lines) > 1:
        lines = lines[1:]  # an xfail: the reason is in the baseline entry already
    if not lines:
        return str(record.get("reason") or "")
    # The message names the case at the line concerned (an expectation, a step), which need
    # not be the case's own line.
    prefix = re.compile(rf"{re.escape(str(record.get('file')))}:\d+: "
                        rf"{re.escape(str(record.get('case')))}\[{re.escape(str(record.get('id')))}\]:")
    head = prefix.sub("", lines[0], count=1).strip()
    text = head if len(lines) < 2 else f"{head}: {lines[1]}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
