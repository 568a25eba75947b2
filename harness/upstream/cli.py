"""``python ci/upstream_table.py [--check]``: validate the upstream-parity data against the
bundled case files and write (or, with --check, compare) docs/upstream.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import library, render, table

ROOT = Path(__file__).resolve().parent.parent.parent


def main(argv: list[str] | None = None) -> int:
    """0 when the data is true (and the page written or current), 1 when it is not, 2 when
    the data or a case file cannot be read."""
    ap = argparse.ArgumentParser(prog="upstream_table", description=__doc__)
    ap.add_argument("--data", type=Path, default=ROOT / render.SOURCE)
    ap.add_argument("--cases", type=Path, default=ROOT / "cases")
    ap.add_argument("--page", type=Path, default=ROOT / "docs" / "upstream.md")
    ap.add_argument("--check", action="store_true",
                    help="do not write; fail if the page differs from what the data renders")
    args = ap.parse_args(argv)
    try:
        data = table.load(args.data)
        lib = library.collect(args.cases)
    except table.TableError as exc:
        print(f"upstream_table: {exc}", file=sys.stderr)
        return 2
    found = table.problems(data, lib)
    for p in found:
        print(f"upstream_table: {args.data}: {p}", file=sys.stderr)
    page = render.render(data)
    if args.check:
        try:
            current = args.page.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"upstream_table: {args.page}: cannot read: {exc}", file=sys.stderr)
            return 2
        if current != page:
            print(f"upstream_table: {args.page} is not what {args.data} renders: run "
                  f"`{render.COMMAND}`", file=sys.stderr)
            return 1
    elif not found:
        try:
            args.page.write_text(page, encoding="utf-8")
        except OSError as exc:
            print(f"upstream_table: {args.page}: cannot write: {exc}", file=sys.stderr)
            return 2
    return 1 if found else 0
