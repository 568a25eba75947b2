"""Compare two conformance reports record by record, timings aside.

    python ci/bench/compare_records.py BEFORE.json[.gz] AFTER.json[.gz] [--show N]

Used to show that a restructure or a faster path changed nothing a report says: the same
instances (by key), and for each the same outcome, expectation, reason, message, pool
replacement, per-rank status, checks (tensor, verdict, counts, digest), events (what ran) and
ordering verdicts. What depends on the clock is left out: every ``duration_s``, event times
(``t_*``), probe times (``return_s``), whether an op had completed at the moment the call
returned (``completed_at_return``, ``at_return_*``: a race the probes observe, not a verdict),
numbers followed by a unit of time inside messages and details, and what a stack dump says
(``stack``, ``stderr_tail``, ``traceback``; addresses, pids and line numbers in messages).
``--ignore FIELD`` leaves out more top-level fields (e.g. ``pool_replaced``, which depends on
whether a health check answered in time on a loaded machine). Exit 0 when equal, 1 when
not (the first N differences printed), 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from harness.report.jsonfile import UnreadableFile, read_json

TIMING_KEYS = {"duration_s", "return_s", "completed_at_return", "at_return_ok",
               "at_return_wrong", "waited_in_thread", "stack", "stderr_tail", "traceback", "phases"}
SECONDS_RE = re.compile(r"\d+(\.\d+)?(e-?\d+)?\s*(s|ms|µs|us)\b")
# Process-specific text: thread and object addresses, pids, line numbers inside stack dumps.
ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]+|\bpid \d+|line \d+|"
                        r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+|"  # c10 log line time stamps
                        r"\d+\.\d+\.\d+\.\d+:\d+|\[[0-9a-f:.]+\]:\d+")  # peer addresses


def load(path: str) -> dict[str, Any]:
    """A report's JSON (plain or gzipped); exits 2 with a one-line error if unusable."""
    try:
        doc = read_json(path, "report")
    except UnreadableFile as exc:
        print(f"compare_records: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        print(f"compare_records: {path}: not a report (no records list)", file=sys.stderr)
        raise SystemExit(2)
    return doc


def normalize(value: Any) -> Any:
    """``value`` with clock-dependent fields dropped and times in text replaced by ``T``."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()
                if k not in TIMING_KEYS and not k.startswith("t_")}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, str):
        return ADDRESS_RE.sub("X", SECONDS_RE.sub("T", value))
    if isinstance(value, float):
        return "F"  # any other float is a measurement (delays are fixed and named in text)
    return value


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per difference: instances on one side only, then fields that differ."""
    a = {r.get("key"): r for r in before["records"]}
    b = {r.get("key"): r for r in after["records"]}
    out = [f"only before: {k}" for k in sorted(set(a) - set(b), key=str)]
    out += [f"only after: {k}" for k in sorted(set(b) - set(a), key=str)]
    for key in sorted(set(a) & set(b), key=str):
        x, y = normalize(a[key]), normalize(b[key])
        for field in sorted(set(x) | set(y)):
            if x.get(field) != y.get(field):
                old, new = json.dumps(x.get(field)), json.dumps(y.get(field))
                at = next((i for i, (p, q) in enumerate(zip(old, new, strict=False)) if p != q),
                          min(len(old), len(new)))
                start = max(0, at - 60)
                out.append(f"{key}: {field}: ...{old[start:at + 100]} -> "
                           f"...{new[start:at + 100]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--show", type=int, default=20, help="differences to print (default 20)")
    ap.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                    help="a record field to leave out of the comparison (repeatable)")
    args = ap.parse_args(argv)
    before, after = load(args.before), load(args.after)
    for doc in (before, after):
        for rec in doc["records"]:
            for name in args.ignore:
                rec.pop(name, None)
    diffs = differences(before, after)
    n = len(before["records"])
    if not diffs:
        print(f"compare_records: {n} records, the same in both reports (timings aside)")
        return 0
    print(f"compare_records: {len(diffs)} difference(s) over {n} / {len(after['records'])} "
          "records:")
    for line in diffs[:max(args.show, 0)]:
        print(f"  {line}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
