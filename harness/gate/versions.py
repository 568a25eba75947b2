"""What changed between two reports: two torch versions (or builds, or backend versions).

Two reports of the same case library are matched instance by instance (case id + axes; the
backend too unless each report has one backend and they differ). An instance *behaves
differently* when its observed behaviour differs: its outcome, or what the case expected of it
where it met that expectation (a pass of a documented rejection is not a pass of a result).
The differences are grouped per op, then per change of behaviour, listing the dtypes involved
and instances as evidence. This is the ``collective-versions`` command, and the page
``docs/reference/torch-versions.md`` is its Markdown output for the committed reference reports.

    collective-versions reports/reference/gloo-cpu-torch2.4.1.json.gz \
        reports/reference/gloo-cpu.json reports/reference/gloo-cpu-torch2.15.0.json.gz \
        --markdown docs/reference/torch-versions.md

Versions are compared on the public version (``2.13.0+cpu`` and ``2.13.0`` are one release,
built for different devices) and the NCCL version the report recorded.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..report.jsonfile import UnreadableFile, printable, unwritable
from ..report.oneline import one_line
from ..report.records import load_report, write_atomic
from .baseline import Baseline, BaselineError, canonical

# How each expectation reads when the instance met it (outcome "passed").
MET = {"pass": "works", "raises": "rejected (raises, documented)",
       "crashes": "aborts the rank (crashes, documented)", "hangs": "hangs (documented)"}
EVIDENCE = 3  # instances quoted per change of behaviour


def load(path: str, hint: str = "") -> dict[str, Any]:
    """Read and validate a report (``.json`` or ``.json.gz``); any problem is a
    :class:`BaselineError` of one line naming the file (``hint`` follows a missing file's
    message)."""
    try:
        return load_report(path, hint)
    except UnreadableFile as exc:
        raise BaselineError(str(exc)) from None


def public_version(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: the release, without the build's local label."""
    return version.split("+")[0].strip()


@dataclass(frozen=True)
class Versions:
    """What a report or baseline says it was run with."""

    torch: str
    nccl: str = ""

    @classmethod
    def of_report(cls, report: dict[str, Any]) -> Versions:
        meta = report.get("metadata") or {}
        return cls(str(meta.get("torch") or ""), str(meta.get("nccl_version") or ""))

    def known(self) -> bool:
        return bool(self.torch)

    def same_as(self, other: Versions) -> bool:
        """Same torch release and the same NCCL (when both recorded one)."""
        if public_version(self.torch) != public_version(other.torch):
            return False
        return not (self.nccl and other.nccl and self.nccl != other.nccl)

    def label(self) -> str:
        text = f"torch {self.torch or '?'}"
        return text + (f", NCCL {self.nccl}" if self.nccl else "")


def across(report: dict[str, Any], base: Baseline) -> str:
    """``"report torch X vs baseline torch Y"`` when they come from different versions, else ""
    (also when the baseline records no version: nothing says they differ)."""
    rv, bv = Versions.of_report(report), Versions(base.torch, base.nccl)
    if not bv.known() or rv.same_as(bv):
        return ""
    return f"report {rv.label()} vs baseline {bv.label()}"


def _error(record: dict[str, Any]) -> str:
    """The first raised error's type and the head of its message, digits and quotes elided,
    so that the same rejection compares equal across runs but a changed one does not."""
    for rank in record.get("ranks") or []:
        exc = rank.get("exception") if isinstance(rank, dict) else None
        if exc:
            text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc.get("message", "")).strip())
            head = re.split(r"[:(]", text, maxsplit=1)[0]  # drop a [file:line] prefix too
            # torch writes some enum values into messages as raw bytes: printable text only
            head = re.sub(r"[^\x20-\x7e]", " ", head)
            head = re.sub(r"\d+", "#", re.sub(r"['\"`].*?['\"`]", "…", head))
            head = re.sub(r"\s+", " ", head)[:45].strip()
            return f"{exc.get('type', 'error')}: {head}" if head else str(exc.get("type"))
    return ""


def behaviour(record: dict[str, Any]) -> str:
    """An instance's observed behaviour in a few words (what two versions are compared on).

    A documented rejection names the error it raised, so a changed error (another type or
    message) is a change of behaviour too."""
    outcome, expected = record["outcome"], record.get("expected", "pass")
    if outcome == "passed":
        met = MET.get(expected, f"meets its expectation ({expected})")
        error = _error(record) if expected == "raises" else ""
        return f"{met}: {error}" if error else met
    if outcome == "xfail":
        return "wrong result or unexpected error (xfail, documented)"
    return str({"failed": "fails", "error": "harness error", "hang": "hangs (undocumented)",
            "crash": "crashes (undocumented)", "skipped": "skipped",
            "xpass": "passes where an xfail is declared",
            "uncheckable": "uncheckable (expected value inexact)"}.get(outcome, outcome))


@dataclass
class Difference:
    """One instance that behaves differently in A and in B."""

    key: str
    op: str
    dtype: str
    a: dict[str, Any]
    b: dict[str, Any]

    @property
    def change(self) -> tuple[str, str]:
        return behaviour(self.a), behaviour(self.b)


@dataclass
class VersionDiff:
    """The comparison of two reports."""

    a_path: str
    b_path: str
    a: Versions
    b: Versions
    a_meta: dict[str, Any]
    b_meta: dict[str, Any]
    matched: int = 0
    differences: list[Difference] = field(default_factory=list)
    only_a: list[dict[str, Any]] = field(default_factory=list)
    only_b: list[dict[str, Any]] = field(default_factory=list)

    def by_op(self) -> dict[str, dict[tuple[str, str], list[Difference]]]:
        """op -> (behaviour in A, behaviour in B) -> instances, ops and changes sorted."""
        out: dict[str, dict[tuple[str, str], list[Difference]]] = defaultdict(
            lambda: defaultdict(list))
        for d in self.differences:
            out[d.op][d.change].append(d)
        return {op: dict(sorted(out[op].items())) for op in sorted(out)}


def _backends(report: dict[str, Any]) -> set[str]:
    return {r["backend"] for r in report["records"]}


def _ident(record: dict[str, Any], with_backend: bool) -> tuple[str, str, str]:
    return (record["backend"] if with_backend else "", f"{record['file']}::{record['case']}",
            canonical(record["axes"]))


def diff(a: dict[str, Any], b: dict[str, Any], a_path: str = "A", b_path: str = "B"
         ) -> VersionDiff:
    """Every instance of ``a`` and ``b`` matched, and the ones that behave differently."""
    ab, bb = _backends(a), _backends(b)
    with_backend = not (len(ab) == 1 and len(bb) == 1 and ab != bb)
    aidx = {_ident(r, with_backend): r for r in a["records"]}
    bidx = {_ident(r, with_backend): r for r in b["records"]}
    res = VersionDiff(a_path, b_path, Versions.of_report(a), Versions.of_report(b),
                      dict(a.get("metadata") or {}), dict(b.get("metadata") or {}))
    for ident, ra in aidx.items():
        rb = bidx.get(ident)
        if rb is None:
            res.only_a.append(ra)
            continue
        res.matched += 1
        if behaviour(ra) != behaviour(rb):
            res.differences.append(Difference(ra["key"], ra.get("op") or "(program)",
                                              str(ra.get("dtype") or "-"), ra, rb))
    res.only_b = [r for ident, r in bidx.items() if ident not in aidx]
    res.differences.sort(key=lambda d: (d.op, d.key))
    return res


# -- rendering ---------------------------------------------------------------------------------

def _md(text: str) -> str:
    text = printable(" ".join(text.split()))  # one line, no terminal escape sequence
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|").replace("`", "'"))


def _why(record: dict[str, Any]) -> str:
    if record["outcome"] == "passed" and record.get("expected", "pass") == "pass":
        return "passed"
    seen = one_line(record, 200) or record["outcome"]
    documented = str(record.get("reason") or "")
    if record["outcome"] == "skipped" or not documented or documented in seen:
        return seen
    # What the case documents for this version, then what was observed.
    short = documented if len(documented) <= 150 else documented[:149] + "…"
    return f"{seen} [documented: {short}]"


def _dtypes(items: list[Difference]) -> str:
    return ", ".join(sorted({d.dtype for d in items}))


def _side(name: str, path: str, v: Versions, meta: dict[str, Any], n: int) -> str:
    backends = ", ".join(meta.get("backends") or []) or "-"
    full = (meta.get("options") or {}).get("full")
    scope = "full library" if full else "quick suite"
    return f"| {name} | `{_md(path)}` | {_md(v.label())} | {backends} | {scope} | {n} |"


def render_pair(res: VersionDiff, level: int = 2) -> list[str]:
    """One comparison as Markdown lines, its headings at ``level`` (A vs B, then per op)."""
    h = "#" * level
    a, b = res.a.label(), res.b.label()
    out = [f"{h} {_md(a)} → {_md(b)}", "",
           "| | report | versions | backends | run | instances |", "|---|---|---|---|---|---|",
           _side("A", res.a_path, res.a, res.a_meta, res.matched + len(res.only_a)),
           _side("B", res.b_path, res.b, res.b_meta, res.matched + len(res.only_b)), ""]
    if res.a.same_as(res.b):
        out += [f"Both reports come from the same versions ({a}): the differences below are "
                "run-to-run or case-library differences, not version differences.", ""]
    out += [f"{res.matched} instances ran in both; **{len(res.differences)} behave "
            f"differently**; {len(res.only_a)} only in A, {len(res.only_b)} only in B.", ""]
    groups = res.by_op()
    if not groups:
        return [*out, "No instance behaves differently.", ""]
    out += ["| op | instances that differ | dtypes | change (A → B, instances) |",
            "|---|---|---|---|"]
    for op, changes in groups.items():
        n = sum(len(v) for v in changes.values())
        kinds = "; ".join(f"{x} → {y} ({len(v)})" for (x, y), v in changes.items())
        dts = _dtypes([d for v in changes.values() for d in v])
        out.append(f"| `{op}` | {n} | {dts} | {_md(kinds)} |")
    out.append("")
    for op, changes in groups.items():
        out += [f"{h}# `{op}` ({_md(a)} → {_md(b)})", ""]
        for (x, y), items in changes.items():
            plural = "s" if len(items) != 1 else ""
            out += [f"**{_md(x)} → {_md(y)}** ({len(items)} instance{plural}; dtypes: "
                    f"{_dtypes(items)})", ""]
            by_dtype: dict[str, list[Difference]] = defaultdict(list)
            for d in items:
                by_dtype[d.dtype].append(d)
            out += ["| dtype | instances | evidence (A / B) |", "|---|---|---|"]
            for dt in sorted(by_dtype):
                ds = by_dtype[dt]
                ev = "<br>".join(f"`{_md(d.key)}` ({d.a['file']}:{d.a['line']}): "
                                 f"A: {_md(_why(d.a))} / B: {_md(_why(d.b))}"
                                 for d in ds[:EVIDENCE])
                more = f"<br>… and {len(ds) - EVIDENCE} more" if len(ds) > EVIDENCE else ""
                out.append(f"| {dt} | {len(ds)} | {ev}{more} |")
            out.append("")
    for name, only in (("A", res.only_a), ("B", res.only_b)):
        if only:
            counts: dict[str, int] = defaultdict(int)
            for r in only:
                counts[r.get("op") or "(program)"] += 1
            listed = ", ".join(f"`{op}` {n}" for op, n in sorted(counts.items()))
            out += [f"Only in {name} ({len(only)} instances the other report did not run: "
                    f"the case library or the options differ): {listed}.", ""]
    return out


def render_markdown(results: Sequence[VersionDiff],
                    title: str = "What changed between torch versions",
                    command: str = "") -> str:
    """The version-diff page: one section per compared pair (consecutive reports)."""
    out = [f"# {title}", ""]
    if command:
        out += [f"Generated by `{command}`; do not edit by hand.", ""]
    out += ["Instances are matched by case id and axes. An instance *behaves differently* "
            "when what it did differs: *works* (passed against the reference model), "
            "*rejected* (raised, as the case documents for that version), *aborts the rank* "
            "(a documented crash), *wrong result or unexpected error* (a declared xfail), "
            "*skipped* (for instance an op that version lacks), or an undocumented failure. "
            "Evidence quotes each side's report for up to three instances per op, change "
            "and dtype.", ""]
    out += ["| A | B | matched | behave differently |", "|---|---|---|---|"]
    for res in results:
        out.append(f"| {_md(res.a.label())} | {_md(res.b.label())} | {res.matched} | "
                   f"{len(res.differences)} |")
    out.append("")
    for res in results:
        out += render_pair(res, 2)
    # Every line escaped as a whole: a field from a report cannot start a line of its own.
    return "\n".join(printable(line) for line in out).rstrip() + "\n"


def render_text(res: VersionDiff) -> str:
    """A terminal summary: both sides first, then the count per op and change."""
    lines = [f"collective-versions: A {res.a_path} ({res.a.label()}) vs B {res.b_path} "
             f"({res.b.label()})",
             f"  {res.matched} matched, {len(res.differences)} behave differently, "
             f"{len(res.only_a)} only in A, {len(res.only_b)} only in B"]
    for op, changes in res.by_op().items():
        for (x, y), items in changes.items():
            lines.append(f"  {op}: {x} -> {y}: {len(items)} ({_dtypes(items)})")
    return "\n".join(printable(line) for line in lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``collective-versions``: 0 on success, 2 for unusable input."""
    p = argparse.ArgumentParser(
        prog="collective-versions",
        description="Compare two collective-harness reports (e.g. two torch versions) and "
                    "list, per op and dtype, the instances that behave differently.")
    p.add_argument("reports", nargs="+", metavar="REPORT",
                   help="two or more reports (JSON or JSON.gz), oldest first: each is "
                        "compared with the next")
    p.add_argument("--markdown", metavar="PATH", help="write the version-diff page here")
    p.add_argument("--title", default="What changed between torch versions",
                   help="the page's heading")
    args = p.parse_args(argv)
    if len(args.reports) < 2:
        p.error("give at least two reports to compare (e.g. OLD.json NEW.json)")
    try:
        why = unwritable(args.markdown, "--markdown page") if args.markdown else ""
        if why:
            raise BaselineError(why)
        loaded = [load(path) for path in args.reports]
        results = [diff(loaded[i], loaded[i + 1], args.reports[i], args.reports[i + 1])
                   for i in range(len(loaded) - 1)]
        for res in results:
            sys.stdout.write(render_text(res))
        if args.markdown:
            command = f"collective-versions {' '.join(args.reports)} --markdown {args.markdown}"
            try:
                write_atomic(args.markdown, render_markdown(results, args.title, command))
            except OSError as exc:
                raise BaselineError(f"{args.markdown}: cannot write it: "
                                    f"{exc.strerror or exc}") from None
    except BaselineError as exc:
        sys.stderr.write(f"collective-versions: error: {printable(exc, 2000)}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
