"""The terminal summary: where the reports went, limitations (``-rL``), an incomplete
session, a session in which nothing ran, and the gate's verdict."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..gate import compare
from ..report.headline import NOTHING_RAN
from .state import GATE_KEY, INFO_KEY, RECORD_ATTR, VERDICT_KEY, WRITTEN_KEY, harness_session


def deselected_line(selection: dict[str, Any]) -> str:
    """What pytest's "N deselected" is made of, where the harness left instances out by itself
    (the long matrix, bandwidth cases, ``--world-size``): pytest counts them together with what
    ``-k``/``-m``/``--deselect`` left out, and a count of the long matrix alone would not add
    up to its number. "" when the harness left nothing out."""
    full = int(selection.get("deselected_full", 0))
    parts = [f"{full:,} instance(s) of the long matrix (marked 'full'; add --full to run them)"
             ] if full else []
    perf = int(selection.get("deselected_perf", 0))
    if perf:
        parts.append(f"{perf:,} bandwidth instance(s) (marked 'perf'; they run under --perf)")
    world = int(selection.get("deselected_world_size", 0))
    if world:
        parts.append(f"{world:,} instance(s) at world sizes --world-size does not name")
    if not parts:
        return ""
    total = int(selection.get("deselected_items", 0))
    rest = total - full - perf - world
    if rest > 0:
        parts.append(f"{rest:,} by -k, -m, --deselect or another plugin")
    total = max(total, full + perf + world)
    return f"collective-harness: {total:,} deselected: " + "; ".join(parts)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    hs = harness_session(config)
    if hs.fallback:
        terminalreporter.write_line(hs.fallback, red=True, bold=True)
    written = config.stash.get(WRITTEN_KEY, None)
    word, headline = config.stash.get(VERDICT_KEY, ("", ""))
    nothing = word == NOTHING_RAN
    if written is not None:
        terminalreporter.ensure_newline()
        for n, line in enumerate(written.splitlines()):
            terminalreporter.write_line(line, red=nothing and n == 0, bold=nothing and n == 0)
    elif nothing:  # --no-report: the verdict is still said
        terminalreporter.ensure_newline()
        terminalreporter.write_line(f"collective-harness: {headline}", red=True, bold=True)
    chars = str(getattr(config.option, "reportchars", "") or "")
    limits = terminalreporter.stats.get("limitation", [])
    if limits and ("L" in chars or "A" in chars):
        terminalreporter.section("limitations (raised, crashed or hung as declared)", sep="-")
        for rep in limits:
            text = getattr(rep, RECORD_ATTR, None)
            why = json.loads(text).get("reason", "") if text else ""
            terminalreporter.write_line(f"LIMITATION {rep.nodeid} - {why}")
    info = config.stash.get(INFO_KEY, None)
    left_out = deselected_line((info or {}).get("selection", {}))
    if left_out:
        terminalreporter.write_line(left_out)
    if info is not None and not info["complete"]:
        terminalreporter.write_line(
            f"collective-harness: INCOMPLETE: {info['without_result']} of {info['collected']} "
            f"collected instance(s) have no result; the session ended: {info['ended_by']}",
            red=True, bold=True)
    res = config.stash.get(GATE_KEY, None)
    if res is None:
        return
    terminalreporter.section("collective-harness gate", sep="=", bold=True,
                             red=not res.ok, green=res.ok)
    for line in compare.render_text(res, max_list=50).rstrip().splitlines():
        terminalreporter.write_line(line)
