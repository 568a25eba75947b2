"""Render the upstream-parity table to Markdown (docs/reference/upstream.md), and the command
``python ci/docs/upstream_table.py [--check]`` that validates the data against the bundled case
files and writes (or, with --check, compares) the page. The counts, the lists of rows not
covered and every row come from the data, so the page cannot drift from it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .upstream_table import (
    STATUSES,
    Assertion,
    Row,
    Table,
    TableError,
    collect,
    counts,
    load,
    problems,
)

SOURCE = "docs/upstream/behaviours.yaml"
PAGE = "docs/reference/upstream.md"
COMMAND = "python ci/docs/upstream_table.py"
ROOT = Path(__file__).resolve().parents[2]
SHOWN_IDS = 3  # instance ids a cell lists before it only counts the rest


def _cell(text: str) -> str:
    # A bar inside a cell would end it; GitHub renders `\|` as a bar, even in code spans.
    return " ".join(text.split()).replace("|", "\\|")


def _check_text(a: Assertion) -> str:
    parts = []
    for c in a.checks:
        ids = ", ".join(f"`{i}`" for i in c.instances[:SHOWN_IDS])
        more = len(c.instances) - SHOWN_IDS
        ids += f" and {more} more" if more > 0 else ""
        parts.append(f"`cases/{c.file}::{c.case}` [{ids}]")
    return "; ".join(parts)


def _ours(r: Row) -> str:
    if not r.assertions:
        return r.ours
    items = []
    for n, a in enumerate(r.assertions, 1):
        text = f"({n}) {a.says} — **{a.status}**"
        checks = _check_text(a)
        text += f": {checks}" if checks else ""
        text += f" ({a.reason})" if a.reason and checks else f": {a.reason}" if a.reason else ""
        items.append(text)
    lead = f"{r.ours} " if r.ours else ""
    return lead + " ".join(items)


def _counts_line(table: Table) -> str:
    c = counts(table)
    n = c["total"]
    stated = c["covered"] + c["expressible"]
    return (f"**covered: {c['covered']} of {n}** · **expressible (covered or statable): "
            f"{stated} of {n}** · partly: {c['partly']} of {n} · no: {c['no']} of {n} · "
            f"re-audited assertion by assertion: {c['audited']} of {n}")


def _missing(table: Table) -> list[str]:
    lines = ["## Rows not covered", ""]
    for status in STATUSES[1:]:
        ids = [r.id for r in table.rows if r.status == status]
        lines.append(f"- **{status}** ({len(ids)}): {', '.join(ids) if ids else 'none'}")
    lines += ["", "Each row's last column says what is missing and why."]
    return lines


def render(table: Table) -> str:
    """The whole page, byte for byte what ``docs/reference/upstream.md`` must hold."""
    lines = ["# Upstream parity: PyTorch's own collective tests, case by case", "",
             f"<!-- Generated from {SOURCE} by `{COMMAND}`; edit the data, not this page. -->",
             "", _counts_line(table), "", table.preamble.rstrip(), "",
             "| id | family | behaviour | upstream test | backends | status | audited "
             "| our case, or why not |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table.rows:
        cells = [r.id, r.family, r.behaviour, r.upstream, r.backends, r.status,
                 r.audited or "—", _ours(r)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", table.gained.rstrip(), "", *_missing(table)]
    lines += ["", "## Keeping this table true", "",
              f"The table is data: `{SOURCE}`. Edit a row there, then run `{COMMAND}` to",
              "rewrite this page; `tests/test_upstream_doc.py` fails when the page differs from",
              "what the data renders, when a named case or instance id does not exist (collected",
              "with the harness's own loader for Gloo and NCCL), or when a row's status is not",
              "the one its assertions give. A re-audited row (`audited:`) lists each upstream",
              "assertion with the case and instance ids that check it, or its status and the",
              "reason; its status is derived: covered only when every assertion is."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """0 when the data is true (and the page written or current), 1 when it is not, 2 when
    the data or a case file cannot be read."""
    ap = argparse.ArgumentParser(prog="upstream_table", description=__doc__)
    ap.add_argument("--data", type=Path, default=ROOT / SOURCE)
    ap.add_argument("--cases", type=Path, default=ROOT / "cases")
    ap.add_argument("--page", type=Path, default=ROOT / PAGE)
    ap.add_argument("--check", action="store_true",
                    help="do not write; fail if the page differs from what the data renders")
    args = ap.parse_args(argv)
    try:
        data = load(args.data)
        lib = collect(args.cases)
    except TableError as exc:
        print(f"upstream_table: {exc}", file=sys.stderr)
        return 2
    found = problems(data, lib)
    for p in found:
        print(f"upstream_table: {args.data}: {p}", file=sys.stderr)
    page = render(data)
    if args.check:
        try:
            current = args.page.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"upstream_table: {args.page}: cannot read: {exc}", file=sys.stderr)
            return 2
        if current != page:
            print(f"upstream_table: {args.page} is not what {args.data} renders: run "
                  f"`{COMMAND}`", file=sys.stderr)
            return 1
    elif not found:
        try:
            args.page.write_text(page, encoding="utf-8")
        except OSError as exc:
            print(f"upstream_table: {args.page}: cannot write: {exc}", file=sys.stderr)
            return 2
    return 1 if found else 0
