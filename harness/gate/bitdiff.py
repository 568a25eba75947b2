"""``collective-diff A B``: instances that passed in both reports but whose output bits changed.

Reports keep a digest of every checked buffer on every rank (the digest the rank-agreement
check compares). Two reports of the same case library (NCCL X vs Y, torch A vs B, NCCL vs a
vendor backend) are matched instance by instance as ``collective-versions`` matches them;
where both passed, the buffers whose digests differ on some rank are listed, grouped by op and
dtype, with the error against the FP64 reference on each side where the reports measured one.
A pass on both sides with other bits is no failure by itself (a sum may round differently and
stay within its bound); ``--fail-on-change`` makes it one, for a policy that forbids it.

    python -m harness.gate.bitdiff old.json new.json [--json PATH] [--fail-on-change]

Exit status: 0 (listed, or none), 1 changes with ``--fail-on-change``, 2 unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .baseline import BaselineError, canonical
from .versions import load

PASSING = ("passed",)


@dataclass
class BitChange:
    """One instance whose checked buffers hold other bits in B than in A."""

    key: str
    op: str
    dtype: str
    buffers: list[str]  # "tensor on ranks 0-3"
    error_a: dict[str, Any]
    error_b: dict[str, Any]


def digests(record: dict[str, Any]) -> dict[tuple[int, str], str]:
    """(rank, buffer) -> digest of every check that has one."""
    out: dict[tuple[int, str], str] = {}
    for rank in record.get("ranks") or []:
        if not isinstance(rank, dict):
            continue
        for c in rank.get("checks") or []:
            if isinstance(c, dict) and c.get("digest"):
                out[(int(rank.get("rank", -1)), str(c.get("tensor")))] = str(c["digest"])
    return out


def _ident(record: dict[str, Any], with_backend: bool) -> tuple[str, str, str]:
    return (record["backend"] if with_backend else "", f"{record['file']}::{record['case']}",
            canonical(record["axes"]))


def changes(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[BitChange], int, int]:
    """The bit changes, how many instances passed on both sides, and how many of those had
    digests to compare."""
    ab = {r["backend"] for r in a["records"]}
    bb = {r["backend"] for r in b["records"]}
    with_backend = not (len(ab) == 1 and len(bb) == 1 and ab != bb)
    bidx = {_ident(r, with_backend): r for r in b["records"]}
    out: list[BitChange] = []
    both = compared = 0
    for ra in a["records"]:
        rb = bidx.get(_ident(ra, with_backend))
        if rb is None or ra["outcome"] not in PASSING or rb["outcome"] not in PASSING:
            continue
        both += 1
        da, db = digests(ra), digests(rb)
        common = sorted(set(da) & set(db))
        if not common:
            continue
        compared += 1
        moved: dict[str, list[int]] = defaultdict(list)
        for rank, name in common:
            if da[(rank, name)] != db[(rank, name)]:
                moved[name].append(rank)
        if moved:
            out.append(BitChange(
                ra["key"], str(ra.get("op") or "(program)"), str(ra.get("dtype") or "-"),
                [f"{n!r} on rank(s) {', '.join(map(str, rs))}" for n, rs in sorted(moved.items())],
                (ra.get("numerics") or {}).get("error") or {},
                (rb.get("numerics") or {}).get("error") or {}))
    out.sort(key=lambda c: (c.op, c.dtype, c.key))
    return out, both, compared


def _err(errors: dict[str, Any]) -> str:
    worst = max((m.get("rel_l2", 0.0) for m in errors.values() if isinstance(m, dict)),
                default=None)
    return "-" if worst is None else f"rel L2 {worst:.2g}"


def render(found: list[BitChange], both: int, compared: int, a: str, b: str) -> str:
    """The text listing, grouped by op and dtype."""
    lines = [f"collective-diff: {a} vs {b}: {both} instance(s) passed on both sides, "
             f"{compared} with digests to compare; {len(found)} changed bits"]
    groups: dict[tuple[str, str], list[BitChange]] = defaultdict(list)
    for c in found:
        groups[(c.op, c.dtype)].append(c)
    for (op, dtype), items in sorted(groups.items()):
        lines.append(f"  {op} {dtype}: {len(items)} instance(s)")
        for c in items:
            lines.append(f"    {c.key}: {'; '.join(c.buffers)} (FP64 error: A "
                         f"{_err(c.error_a)}, B {_err(c.error_b)})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="collective-diff", description=__doc__.split("\n")[0])
    p.add_argument("a", metavar="A", help="a JSON report (.json or .json.gz)")
    p.add_argument("b", metavar="B", help="the report to compare it with")
    p.add_argument("--json", metavar="PATH", help="also write the changes as JSON")
    p.add_argument("--fail-on-change", action="store_true",
                   help="exit 1 when a passing instance changed its bits")
    args = p.parse_args(argv)
    try:
        ra, rb = load(args.a), load(args.b)
    except BaselineError as exc:
        print(f"collective-diff: {exc}", file=sys.stderr)
        return 2
    found, both, compared = changes(ra, rb)
    print(render(found, both, compared, args.a, args.b))
    if args.json:
        doc = {"a": args.a, "b": args.b, "passed_both": both, "compared": compared,
               "changed": [c.__dict__ for c in found]}
        try:
            with open(args.json, "w") as fh:
                json.dump(doc, fh, indent=1)
        except OSError as exc:
            print(f"collective-diff: cannot write {args.json}: {exc.strerror}", file=sys.stderr)
            return 2
    return 1 if found and args.fail_on_change else 0


if __name__ == "__main__":
    raise SystemExit(main())
