"""A rank's output log, as the verdict quotes it: a bounded, escaped tail.

Every rank's stdout and stderr go to one file for the pool's life (harness.run.rank), so the
file holds what every instance that ran on those ranks printed, and what the backend's own
threads printed in between (an exception in a backend's callback thread is printed there and
nowhere else). A hang or crash quotes its last lines; the decisive line is often the last
thing a backend thread printed, sometimes during an earlier instance, so the tail reaches back
past the start of this instance and says where that boundary is.

Bounded whatever the rank printed: at most :data:`TAIL_BYTES` are read from the end of the
file, at most :data:`TAIL_LINES` lines of at most :data:`LINE_CHARS` characters each are
kept, and every control character is written as an escape, so a rank's output can neither
flood a report nor drive the terminal that shows it.
"""

from __future__ import annotations

import os
import re

TAIL_LINES = 20
LINE_CHARS = 300
TAIL_BYTES = 64 * 1024
# faulthandler's crash report (a segfault's stack): kept whole, up to this many lines.
FATAL_LINES = 3 * TAIL_LINES
EARLIER = "(the lines above were printed before this instance began)"
# Noise every rank prints while torch starts, never the reason for anything.
_NOISE = ("Failed to initialize NumPy", "Extension modules:")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape(line: str) -> str:
    """``line`` cut to :data:`LINE_CHARS` characters, control characters written as escapes
    (``\\x1b``); tabs too, so that nothing but the text reaches a terminal."""
    if len(line) > LINE_CHARS:
        line = line[:LINE_CHARS] + f"... ({len(line) - LINE_CHARS} more characters)"
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), line)


def _read_end(path: str) -> tuple[bytes, int]:
    """The last :data:`TAIL_BYTES` of ``path`` and the offset they start at."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        start = max(0, size - TAIL_BYTES)
        fh.seek(start)
        return fh.read(TAIL_BYTES), start


def _lines(raw: bytes) -> list[str]:
    text = raw.decode("utf-8", errors="replace")
    return [ln for ln in text.splitlines() if not ln.startswith(_NOISE[1])
            and _NOISE[0] not in ln]


def tail(path: str, since: int = 0) -> str:
    """The last lines of the log at ``path`` ("" when it cannot be read or holds nothing),
    escaped and bounded; ``since``: the offset at which this instance's output begins (lines
    before it are kept only to fill the tail, under a line that says so)."""
    try:
        raw, start = _read_end(path)
    except OSError:
        return ""
    if start and b"\n" in raw:  # the first line read is a fragment of a longer one
        raw, start = raw[raw.index(b"\n") + 1:], start + raw.index(b"\n") + 1
    cut = min(max(since - start, 0), len(raw))
    before, after = _lines(raw[:cut]), _lines(raw[cut:])
    fatal = [i for i, ln in enumerate(after) if ln.startswith("Fatal Python error")]
    if fatal:  # faulthandler's crash report: keep it whole, minus helper threads
        text = "\n".join(after[fatal[-1]:fatal[-1] + FATAL_LINES])
        head, _, rest = text.partition("\n\n")
        return "\n".join(escape(ln) for ln in
                         (head + "\n\n" + clean_stack(rest)).strip().splitlines())
    kept = after[-TAIL_LINES:]
    room = TAIL_LINES - len(kept)
    if room > 0 and before:
        kept = [*before[-room:], EARLIER, *kept]
    return "\n".join(ln if ln == EARLIER else escape(ln) for ln in kept)


def size(path: str) -> int:
    """The size of ``path`` in bytes (0 when it cannot be read)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def clean_stack(text: str) -> str:
    """Keep the thread that runs the program; drop the harness's helper threads and the
    multiprocessing frames below the rank's main loop."""
    blocks = [b.strip() for b in text.strip().split("\n\n") if b.strip()]
    main = [b for b in blocks if "in rank_main" in b] or blocks
    out: list[str] = []
    for block in main:
        lines = block.splitlines()
        cut = next((i for i, ln in enumerate(lines) if "in rank_main" in ln), len(lines) - 1)
        out.append("\n".join(lines[: cut + 1]))
    return "\n\n".join(out)
