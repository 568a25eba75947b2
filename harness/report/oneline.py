"""One-line reasons for report records, shared by the gate and the HTML report."""

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
