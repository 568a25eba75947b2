"""``collective-diff A B``: instances that passed in both reports but whose output bits changed.

Reports keep a digest of every checked buffer on every rank (the digest the rank-agreement
check compares). Two reports of the same case library (NCCL X vs Y, torch A vs B, NCCL vs a
vendor backend) are matched instance by instance as ``collective-versions`` matches them;
where both passed, the buffers whose digests differ on some rank are listed, grouped by op and
dtype, with the error against the FP64 reference on each side where the reports measured one.
A pass on both sides with other bits is no failure by itself (a sum may round differently and
stay within its bound); ``--fail-on-change`` makes it one, for a policy that forbids it.

What A compared (an instance that passed in A with digests) and B cannot confirm is listed
too, never passed over as "no change": the instance missing from B, not passed in B, passed
without digests, or a rank's buffer that has no digest in B. With ``--fail-on-change`` any
of these fails the command as a change does, and so does a comparison that compared nothing.

    python -m harness.gate.bitdiff old.json new.json [--json PATH] [--fail-on-change]

Exit status: 0 (listed, or none), 1 with ``--fail-on-change`` when bits changed, something A
compared could not be compared in B, or nothing was compared at all; 2 unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..report.jsonfile import printable
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


@dataclass
class Uncompared:
    """Something A compared that B cannot confirm: an instance, or buffers of one."""

    key: str
    why: str  # one of WHY
    detail: str = ""  # which buffers, or the outcome in B


WHY = {"missing": "no record in B", "not passed": "did not pass in B",
       "no digests": "passed in B without digests", "buffers": "buffers without a digest in B"}
LISTED = 10  # per reason in the text listing; the JSON has every one


@dataclass
class Diff:
    """What comparing two reports found."""

    changed: list[BitChange]
    passed_both: int  # instances that passed on both sides
    compared: int  # of those, how many had digests on both sides
    uncompared: list[Uncompared]
    a_without_digests: int  # passed in A with no digest: nothing to compare there
    only_in_b: int  # instances B has and A lacks


def changes(a: dict[str, Any], b: dict[str, Any]) -> Diff:
    """Every bit change, and everything A compared that B cannot confirm."""
    ab = {r["backend"] for r in a["records"]}
    bb = {r["backend"] for r in b["records"]}
    with_backend = not (len(ab) == 1 and len(bb) == 1 and ab != bb)
    bidx = {_ident(r, with_backend): r for r in b["records"]}
    seen: set[tuple[str, str, str]] = set()
    diff = Diff([], 0, 0, [], 0, 0)
    for ra in a["records"]:
        ident = _ident(ra, with_backend)
        seen.add(ident)
        rb = bidx.get(ident)
        if ra["outcome"] not in PASSING:
            continue  # A vouched for nothing here; outcomes are the gate's business
        da = digests(ra)
        if not da:
            diff.a_without_digests += 1
        if rb is None or rb["outcome"] not in PASSING:
            if da:
                diff.uncompared.append(Uncompared(ra["key"], "missing") if rb is None else
                                       Uncompared(ra["key"], "not passed", str(rb["outcome"])))
            continue
        diff.passed_both += 1
        db = digests(rb)
        if da and not db:
            diff.uncompared.append(Uncompared(ra["key"], "no digests"))
            continue
        lost = sorted(set(da) - set(db))  # ranks or buffers of A that B lacks
        if lost:
            diff.uncompared.append(Uncompared(ra["key"], "buffers", "; ".join(_buffers(lost))))
        common = sorted(set(da) & set(db))
        if not common:
            continue
        diff.compared += 1
        moved = sorted(k for k in common if da[k] != db[k])
        if moved:
            diff.changed.append(BitChange(
                ra["key"], str(ra.get("op") or "(program)"), str(ra.get("dtype") or "-"),
                _buffers(moved),
                (ra.get("numerics") or {}).get("error") or {},
                (rb.get("numerics") or {}).get("error") or {}))
    diff.only_in_b = len(set(bidx) - seen)
    diff.changed.sort(key=lambda c: (c.op, c.dtype, c.key))
    return diff


def _buffers(keys: list[tuple[int, str]]) -> list[str]:
    """``["'out' on rank(s) 0", "'t' on rank(s) 1, 3"]`` for (rank, buffer) pairs."""
    ranks: dict[str, list[int]] = defaultdict(list)
    for rank, name in keys:
        ranks[name].append(rank)
    return [f"{n!r} on rank(s) {', '.join(map(str, sorted(rs)))}"
            for n, rs in sorted(ranks.items())]


def _err(errors: dict[str, Any]) -> str:
    worst = max((m.get("rel_l2", 0.0) for m in errors.values() if isinstance(m, dict)),
                default=None)
    return "-" if worst is None else f"rel L2 {worst:.2g}"


def render(diff: Diff, a: str, b: str) -> str:
    """The text listing: the headline, changes grouped by op and dtype, then what could not
    be compared, grouped by reason."""
    head = (f"collective-diff: {printable(a, 200)} vs {printable(b, 200)}: "
            f"{diff.passed_both} instance(s) passed on both sides, {diff.compared} with "
            "digests to compare; ")
    if diff.compared:
        head += f"{len(diff.changed)} changed bits"
    else:  # "0 changed bits" would claim a comparison that did not happen
        head += "nothing compared, so no bits are vouched for"
    if diff.uncompared:
        head += f"; {len(diff.uncompared)} compared in A could not be compared in B"
    lines = [head]
    groups: dict[tuple[str, str], list[BitChange]] = defaultdict(list)
    for c in diff.changed:
        groups[(c.op, c.dtype)].append(c)
    for (op, dtype), items in sorted(groups.items()):
        lines.append(f"  {printable(op)} {printable(dtype)}: {len(items)} instance(s)")
        for c in items:
            lines.append(f"    {printable(c.key, 200)}: {printable('; '.join(c.buffers), 300)} "
                         f"(FP64 error: A {_err(c.error_a)}, B {_err(c.error_b)})")
    for why, label in WHY.items():
        items2 = [u for u in diff.uncompared if u.why == why]
        if items2:
            lines.append(f"  not compared: {label}: {len(items2)} instance(s)")
            lines += [f"    {printable(u.key, 200)}"
                      + (f": {printable(u.detail, 300)}" if u.detail else "")
                      for u in items2[:LISTED]]
            if len(items2) > LISTED:
                lines.append(f"    ... and {len(items2) - LISTED} more (--json lists each)")
    if diff.a_without_digests:
        lines.append(f"  {diff.a_without_digests} instance(s) passed in A without digests: "
                     "nothing of theirs to compare")
    if diff.only_in_b:
        lines.append(f"  {diff.only_in_b} instance(s) only in B: nothing in A to compare with")
    return "\n".join(lines)


def failed(diff: Diff) -> bool:
    """Whether ``--fail-on-change`` fails: a change, something A compared that B cannot
    confirm, or nothing compared at all."""
    return bool(diff.changed or diff.uncompared or not diff.compared)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="collective-diff", description=__doc__.split("\n")[0])
    p.add_argument("a", metavar="A", help="a JSON report (.json or .json.gz)")
    p.add_argument("b", metavar="B", help="the report to compare it with")
    p.add_argument("--json", metavar="PATH", help="also write the changes as JSON")
    p.add_argument("--fail-on-change", action="store_true",
                   help="exit 1 when a passing instance changed its bits, when something A "
                   "compared cannot be compared in B, or when nothing was compared")
    args = p.parse_args(argv)
    try:
        ra, rb = load(args.a), load(args.b)
    except BaselineError as exc:
        print(f"collective-diff: {exc}", file=sys.stderr)
        return 2
    diff = changes(ra, rb)
    print(render(diff, args.a, args.b))
    if args.json:
        doc = {"a": args.a, "b": args.b, "passed_both": diff.passed_both,
               "compared": diff.compared, "changed": [c.__dict__ for c in diff.changed],
               "uncompared": [u.__dict__ for u in diff.uncompared],
               "a_without_digests": diff.a_without_digests, "only_in_b": diff.only_in_b}
        try:
            with open(args.json, "w") as fh:
                json.dump(doc, fh, indent=1)
        except OSError as exc:
            print(f"collective-diff: cannot write {args.json}: {exc.strerror}", file=sys.stderr)
            return 2
    return 1 if args.fail_on_change and failed(diff) else 0


if __name__ == "__main__":
    raise SystemExit(main())
