"""What a run counted, as progress lines and the end-of-run summary.

A :class:`Tally` is the summary's numbers for one fuzzer (instances by op and outcome, the
known overrides that absorbed instances, differential comparisons, confirmation runs, the
"also fails" counts). One lane's tally travels to the coordinator as JSON (checked there by
:mod:`harness.fuzz.wire`); the coordinator adds the lanes' tallies up and prints the same
lines as a run in one process.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..report.jsonfile import printable
from .engine import AlsoFails, Finding, Fuzzer, Stats
from .known import KnownLibrary

PROG = "collective-fuzz"
COUNTS = ("tried", "shrinking", "invalid", "repeats", "confirm_runs")
REASON_CHARS = 200  # an override's reason, as far as the summary shows it (90) and more


@dataclass
class Tally:
    """The counters of one fuzzer, or of several added up."""

    stats: Stats = field(default_factory=Stats)
    absorbed: Counter[str] = field(default_factory=Counter)  # override (file:line) -> count
    reasons: dict[str, str] = field(default_factory=dict)  # override -> its reason
    compared: int = 0  # instances compared bit for bit (differential mode)
    also: Counter[str] = field(default_factory=Counter)  # signature -> bad there too

    @classmethod
    def of(cls, fz: Fuzzer, known: KnownLibrary, compared: int) -> Tally:
        """The tally of a fuzzer as it stands (its stats are shared, not copied)."""
        return cls(fz.stats, Counter(known.absorbed), dict(known.reasons), compared,
                   Counter({sig: a.count for sig, a in fz.also.items()}))

    def to_json(self) -> dict[str, Any]:
        """As plain JSON values (what a lane sends)."""
        s = self.stats
        return {**{k: getattr(s, k) for k in COUNTS}, "by_op": dict(s.by_op),
                "outcomes": dict(s.outcomes), "absorbed": dict(self.absorbed),
                "reasons": {k: v[:REASON_CHARS] for k, v in self.reasons.items()},
                "compared": self.compared, "also": dict(self.also)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Tally:
        """From :meth:`to_json`'s shape, already checked (:func:`harness.fuzz.wire.decode`)."""
        stats = Stats(**{k: obj[k] for k in COUNTS}, by_op=Counter(obj["by_op"]),
                      outcomes=Counter(obj["outcomes"]))
        return cls(stats, Counter(obj["absorbed"]), dict(obj["reasons"]), obj["compared"],
                   Counter(obj["also"]))

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts to these (the start time stays this tally's)."""
        for k in COUNTS:
            setattr(self.stats, k, getattr(self.stats, k) + getattr(other.stats, k))
        self.stats.by_op.update(other.stats.by_op)
        self.stats.outcomes.update(other.stats.outcomes)
        self.absorbed.update(other.absorbed)
        self.reasons.update(other.reasons)
        self.compared += other.compared
        self.also.update(other.also)


def progress_line(stats: Stats, note: str, found: int) -> str:
    """One progress line: tried, per second, findings, what is happening."""
    return (f"{PROG}: {stats.tried} instances ({stats.rate():.0f}/s), "
            f"{found} finding(s), {stats.shrinking} while shrinking"
            + (f"; {note}" if note else ""))


def summary(tally: Tally, findings: list[Finding], also: list[AlsoFails],
            differ_label: str | None, confirming: bool, state: str = "") -> str:
    """The end-of-run summary: instances by op, absorbed overrides, findings. ``state``:
    "" for a run that ended by itself, else what ended it otherwise ("interrupted")."""
    s = tally.stats
    took = time.monotonic() - s.started
    lines = [f"{PROG} summary{f' ({state})' if state else ''}: {s.tried} instances "
             f"in {took:.0f} s ({s.rate():.1f}/s), {s.shrinking} while shrinking; "
             f"{len(findings)} finding(s)"]
    lines.append("  instances by op: " + ", ".join(f"{op} {n}" for op, n in
                                                   sorted(s.by_op.items())))
    lines.append("  outcomes: " + ", ".join(f"{k} {n}" for k, n in sorted(s.outcomes.items())))
    if s.invalid:
        lines.append(f"  {s.invalid} generated document(s) were not valid cases (a fuzzer bug)")
    if tally.absorbed:
        lines.append(f"  known behaviour (overrides that absorbed instances, "
                     f"{sum(tally.absorbed.values())} in all):")
        lines += [f"    {n:>5}  {where}: {printable(tally.reasons.get(where, ''), 90)}"
                  for where, n in tally.absorbed.most_common()]
    if differ_label is not None:
        lines.append(f"  differential: {tally.compared} passing instance(s) compared with "
                     f"{differ_label}")
    if confirming:
        lines.append(f"  confirmation: {s.confirm_runs} bad instance(s) run again on the "
                     "confirming backend")
    for a in also:
        lines.append(f"  ALSO FAILS WITHOUT THE FAULT {a.signature}: {a.path} ({a.count} "
                     f"instance(s); there: {a.confirm_outcome})")
    for f in findings:
        where = "" if f.lane is None else f"lane {f.lane}, "
        again = f"; found again by other lanes {f.again} time(s)" if f.again else ""
        lines.append(f"  FINDING {f.signature}: {f.path} ({where}after "
                     f"{f.found_after_examples} instance(s), {f.found_after_s:.1f} s{again})")
        lines.append(f"          {printable(f.message.splitlines()[0] if f.message else '', 160)}")
        if f.exception:
            lines.append(f"          raised {printable(f.exception, 160)}")
    return "\n".join(lines)
