"""Compose a GitHub Actions job summary: the gate's verdict first, the matrix folded below.

GitHub caps a step's ``$GITHUB_STEP_SUMMARY`` at 1 MiB and drops the whole summary when it is
larger, so the text is cut to a byte budget here: on a line boundary, never inside a UTF-8
character, closing an open code fence and the ``<details>`` block, with a note saying where the
rest is. The verdict keeps priority over the matrix. Used by ``ci/step_summary.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

GITHUB_LIMIT = 1024 * 1024
# Headroom for what GitHub counts that we do not (line endings, its own wrapping).
DEFAULT_BUDGET = GITHUB_LIMIT - 16 * 1024
NOTE = "\n\n> ✂️ Truncated to fit the 1 MiB job-summary limit: {n} more bytes. The full " \
       "report is in this run's artifacts.\n"


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def truncate(text: str, budget: int) -> str:
    """``text`` cut to at most ``budget`` UTF-8 bytes (note included) on a line boundary."""
    if _size(text) <= budget:
        return text
    note = NOTE.format(n=_size(text))  # the count is an upper bound of what is left out
    room = max(0, budget - _size(note) - 8)  # 8: a closing fence if needed
    kept: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        n = _size(line)
        if used + n > room:
            if not kept:  # one huge first line: cut it at a character boundary
                kept.append(line.encode("utf-8")[:room].decode("utf-8", errors="ignore"))
            break
        kept.append(line)
        used += n
    out = "".join(kept)
    if sum(ln.lstrip().startswith("```") for ln in out.splitlines()) % 2:
        out = out.rstrip("\n") + "\n```"
    dropped = _size(text) - _size(out)
    return out.rstrip("\n") + NOTE.format(n=dropped)


def notices(matrix: str) -> str:
    """The report's leading notices (an incomplete session, overrides not applied), which a
    reader must see before any count: shown above the fold, not inside ``<details>``."""
    keep: list[str] = []
    for line in matrix.splitlines():
        if not line.startswith("> "):
            break
        keep.append(line)
    return "\n".join(keep)


def compose(verdict: str, matrix: str, budget: int = DEFAULT_BUDGET,
            matrix_title: str = "Conformance matrix") -> str:
    """Verdict (with the report's leading notices), then the matrix inside ``<details>``,
    within ``budget`` bytes in all."""
    head_notes = notices(matrix.lstrip())
    verdict = verdict.rstrip() + "\n" + (f"\n{head_notes}\n" if head_notes else "")
    head = f"\n<details><summary>{matrix_title}</summary>\n\n"
    tail = "\n\n</details>\n"
    frame = _size(head) + _size(tail)
    matrix = matrix.strip() + "\n"
    if _size(verdict) + frame + _size(matrix) > budget:
        # Both do not fit: the verdict keeps up to three quarters, the matrix the rest.
        verdict = truncate(verdict, max(budget * 3 // 4, budget - frame - _size(matrix)))
    body = truncate(matrix, budget - _size(verdict) - frame)
    return verdict + head + body.rstrip("\n") + tail


def _read(path: str | None, missing: str) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return missing.format(path=path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python ci/step_summary.py --gate G.md --matrix M.md [--out PATH]``"""
    p = argparse.ArgumentParser(prog="step_summary",
                                description="Write the gate verdict and the conformance matrix "
                                            "to the GitHub job summary, within its size limit.")
    p.add_argument("--gate", metavar="MD", help="the gate's Markdown (collective-gate "
                                                "--markdown)")
    p.add_argument("--matrix", metavar="MD", help="the Markdown report (reports/conformance.md)")
    p.add_argument("--title", default="Conformance matrix", help="summary of the <details>")
    p.add_argument("--out", metavar="PATH", default=os.environ.get("GITHUB_STEP_SUMMARY"),
                   help="file to append to (default $GITHUB_STEP_SUMMARY, else stdout)")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET, metavar="BYTES",
                   help=f"byte budget for the whole summary (default {DEFAULT_BUDGET})")
    args = p.parse_args(argv)
    verdict = _read(args.gate, "## ❓ No gate verdict\n\n`{path}` was not written: the "
                               "conformance run or the gate did not get that far; see the log.")
    matrix = _read(args.matrix, "`{path}` was not written: no conformance report.")
    if not args.gate:
        verdict = "## Conformance report\n"
    budget = args.budget
    if args.out and os.path.exists(args.out):
        budget -= os.path.getsize(args.out)  # earlier steps' summaries count towards the cap
    text = compose(verdict, matrix, max(budget, 0), args.title)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
