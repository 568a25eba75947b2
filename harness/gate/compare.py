"""The CI gate: compare a conformance report with a committed baseline.

Every instance is classified (see :data:`harness.gate.baseline.CATEGORIES`):

- ``regression``: it met its expectation in the baseline (passed, xfail, xpass) and now fails,
  errors, hangs or crashes, or is newly a declared expected failure (xfail);
- ``new_failure``: it fails now and never ran in the baseline (absent or skipped there);
- ``fixed``: it failed (or was an xfail) in the baseline and passes now;
- ``missing``: in the baseline, not in the report; ``new``: the reverse, and not failing;
- ``newly_skipped``: it ran in the baseline and is skipped now (coverage lost);
- ``changed``: any other outcome change (failed -> hang, an xfail added to a failing case...);
- ``unchanged``: the same outcome, or one the baseline entry ``allow``s.

A ``limitation`` (rejected, crashed or hung as declared) met its expectation like a pass: a
pass that becomes a limitation is a regression (the backend stopped doing what the contract
says), a limitation that becomes a pass is ``fixed``, one that starts failing a regression.

Besides the instances, the gate checks the session behind the report: an incomplete session
(policy key ``incomplete``, default fail), pytest failures that no failing record explains and
a report in which no instance was executed (verdict NOTHING RAN: every record skipped, or none;
both always fail, whatever the baseline says: the gate is never more positive than the
evidence); and the command checks that the records are the evidence the report claims
(:mod:`harness.gate.evidence`, always fail).

Across versions (report and baseline from different torch releases or NCCL versions, see
:mod:`harness.gate.versions`) a matched instance whose outcome differs is ``changed``, never a
regression, new failure, fix or newly skipped instance: the difference may be the new version's,
not the code's. The result names both versions first; gate against a baseline of the same
version to find regressions.

The baseline's ``policy`` (overridable with ``--policy``) says which categories fail the gate
(exit 1), which only warn, and which are informational. The command is
:mod:`harness.gate.cli`. Regressions and new failures are rendered by cause, largest group
first (:mod:`harness.gate.causes`), the other categories one line per instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..model import BAD_OUTCOMES
from ..report.jsonfile import printable
from . import baseline as bl
from . import causes
from .baseline import Baseline, BaselineError, Entry, Level

BAD = frozenset(BAD_OUTCOMES)
PASSING = frozenset({"passed", "xpass"})
MET = frozenset({"passed", "xpass", "xfail", "limitation"})
Match = Literal["auto", "exact", "agnostic"]
# Problems no policy can allow: pytest failures the records do not explain, records that are
# not the evidence the report claims (see :mod:`harness.gate.evidence`), and no record at all
# of an instance that ran (a baseline of skips would otherwise be met by a run of skips).
ALWAYS_FAIL = frozenset({"unexplained", "evidence", "nothing_ran"})
TITLES = {"regression": "Regressions", "new_failure": "New failures", "missing": "Missing",
          "newly_skipped": "Newly skipped", "fixed": "Fixed", "new": "New",
          "changed": "Changed", "unchanged": "Unchanged"}


@dataclass(frozen=True)
class Change:
    """One instance's classification: what it was in the baseline, what it is now."""

    category: str
    key: str
    was: str  # baseline outcome, "" if absent
    now: str  # report outcome, "" if absent
    reason: str  # one line
    where: str = ""  # file:line of the case
    cause: str = ""  # the failure's cause key (harness.gate.causes); "" when it passes

    def line(self, reason: bool = True) -> str:
        """``key (file:line): was -> now: reason`` (without the reason: an example of a
        cause that already says it)."""
        where = f" ({self.where})" if self.where else ""
        arrow = f"{self.was or 'absent'} -> {self.now or 'absent'}"
        return (f"{self.key}{where}: {arrow}"
                + (f": {self.reason}" if self.reason and reason else ""))


@dataclass
class GateResult:
    """The whole comparison: every change, the policy applied and how instances were matched."""

    changes: list[Change]
    policy: dict[str, Level]
    agnostic: bool
    report_backends: list[str]
    baseline_backends: list[str]
    report_label: str = ""
    baseline_label: str = ""
    notes: list[str] = field(default_factory=list)
    # Session-level problems: (policy key or one of ALWAYS_FAIL, message).
    problems: list[tuple[str, str]] = field(default_factory=list)
    refresh_hint: str = ""  # how to refresh the baseline in use (default: the bundled one's)
    across_versions: str = ""  # "report torch X vs baseline torch Y" when they differ

    def of(self, category: str) -> list[Change]:
        return [c for c in self.changes if c.category == category]

    def counts(self) -> dict[str, int]:
        return {cat: len(self.of(cat)) for cat in bl.CATEGORIES}

    def failing(self) -> list[str]:
        """Categories with instances (or session problems) whose policy is ``fail``."""
        out = [c for c, n in self.counts().items() if n and self.policy.get(c) == "fail"]
        out += [k for k, _ in self.problems
                if k in ALWAYS_FAIL or self.policy.get(k, "fail") == "fail"]
        return out

    def warning(self) -> list[str]:
        out = [c for c, n in self.counts().items() if n and self.policy.get(c) == "warn"]
        return out + [k for k, _ in self.problems if self.policy.get(k) == "warn"]

    @property
    def ok(self) -> bool:
        return not self.failing()

    def verdict(self) -> str:
        """``FAIL: 3 regression, 1 new_failure (40 instances: ...)`` — the first line of output."""
        counts = self.counts()
        word = "PASS" if self.ok else "FAIL"
        blocking = self.failing() if not self.ok else self.warning()
        head = ", ".join(f"{counts[c]} {c}" if c in counts else c for c in blocking)
        if self.ok and blocking:
            word = "PASS with warnings"
        total = sum(counts.values())
        detail = ", ".join(f"{n} {c}" for c, n in counts.items() if n)
        return f"{word}" + (f": {head}" if head else "") + f" ({total} instances: {detail or '-'})"


def _classify_pair(b: Entry, r: Entry) -> str:
    was, now = b.outcome, r.outcome
    if now == was or now in b.allow:
        return "unchanged"
    if now == "skipped":
        return "newly_skipped"
    if now in BAD:
        if was in BAD:
            return "changed"
        return "new_failure" if was == "skipped" else "regression"
    if now in PASSING:
        return "fixed" if (was in BAD or was in ("xfail", "limitation")) else "changed"
    if now == "uncheckable":
        # Not a pass: the check could not be made, so it never counts as one.
        return "regression" if was in PASSING else "changed"
    if now == "limitation":
        # The backend now rejects (crashes, hangs) where it did what the contract says.
        return "regression" if was in PASSING else "changed"
    # now == "xfail": a failure someone declared; it hides a regression if it passed before.
    return "regression" if was in PASSING else "changed"


def _index(entries: list[Entry], with_backend: bool, side: str
           ) -> dict[tuple[str, str, str], Entry]:
    out: dict[tuple[str, str, str], Entry] = {}
    for e in entries:
        ident = e.identity(with_backend)
        if ident in out:
            raise BaselineError(
                f"{side}: two instances match as one ({out[ident].key} and {e.key}); matching "
                "across backends needs one backend on each side: use --match exact, or gate "
                "each backend's report separately")
        out[ident] = e
    return out


def compare(report_entries: list[Entry], base: Baseline, match: Match = "auto",
            policy: dict[str, Level] | None = None, across_versions: str = "") -> GateResult:
    """Classify every instance of the report against the baseline.

    ``across_versions`` (non-empty: the two versions, for the result) says the report and the
    baseline come from different versions: matched instances whose outcome differs are then
    ``changed``.
    """
    rb = sorted({e.backend for e in report_entries})
    bb = base.backends
    notes: list[str] = []
    if match == "auto":
        agnostic = len(rb) == 1 and len(bb) == 1 and rb != bb
    else:
        agnostic = match == "agnostic"
    if agnostic:
        notes.append(f"matched by case id + axes, ignoring the backend (report: "
                     f"{', '.join(rb) or '-'}; baseline: {', '.join(bb) or '-'})")
    else:
        notes.append("matched by backend + case id + axes")
    ridx = _index(report_entries, not agnostic, "report")
    bidx = _index(base.entries, not agnostic, base.path or "baseline")
    changes: list[Change] = []
    for ident, r in ridx.items():
        b = bidx.get(ident)
        if b is None:
            cat = "new_failure" if r.outcome in BAD else "new"
            changes.append(Change(cat, r.key, "", r.outcome, r.reason, r.where, r.cause))
        else:
            cat = _classify_pair(b, r)
            if across_versions and cat not in ("unchanged", "changed"):
                cat = "changed"
            reason = r.reason if r.outcome != "passed" else (b.reason and f"was: {b.reason}")
            changes.append(Change(cat, r.key, b.outcome, r.outcome, reason, r.where, r.cause))
    for ident, b in bidx.items():
        if ident not in ridx:
            changes.append(Change("missing", b.key, b.outcome, "", "not in the report "
                                  "(removed, renamed or deselected)"))
    changes.sort(key=lambda c: c.key)
    if across_versions:
        notes.insert(0, f"{across_versions}: different versions, so an instance whose outcome "
                        "differs is classified as changed, not as a regression, new failure, "
                        "fix or newly skipped instance (gate against a baseline of the same "
                        "version for those)")
    return GateResult(changes, {**base.policy, **(policy or {})}, agnostic, rb, bb,
                      notes=notes, across_versions=across_versions)


def executed(report: dict[str, Any]) -> int:
    """How many of ``report``'s records are of an instance that ran (any outcome but
    ``skipped``)."""
    return sum(isinstance(r, dict) and r.get("outcome") != "skipped"
               for r in report.get("records") or [])


def nothing_ran(report: dict[str, Any]) -> str:
    """Why ``report`` judged no instance (one line), or "" when at least one ran."""
    if executed(report):
        return ""
    total = len(report.get("records") or [])
    what = (f"all {total} instance(s) of the report were skipped (each record says why)"
            if total else "the report holds no instance (none was collected or all were "
            "deselected)")
    return (f"nothing ran: {what}; a run that judged nothing passes nothing, whatever the "
            "baseline says")


def check_session(res: GateResult, report: dict[str, Any]) -> None:
    """Add the session-level problems of ``report`` to ``res``: no instance executed, an
    incomplete session, and pytest failures that no failing record explains (a lost record,
    a collection error)."""
    why = nothing_ran(report)
    if why:
        res.problems.append(("nothing_ran", why))
    session = report.get("session")
    if not isinstance(session, dict):
        return
    if not session.get("complete", True):
        res.problems.append((
            "incomplete",
            f"the session was incomplete: {session.get('without_result', '?')} of "
            f"{session.get('collected', '?')} collected instance(s) have no result; it ended: "
            f"{session.get('ended_by') or 'unknown'} (policy key 'incomplete')"))
    unexplained = session.get("unexplained_failures", 0)
    if unexplained:
        res.problems.append((
            "unexplained",
            f"pytest counted {session.get('pytest_failures')} failure(s) but only "
            f"{session.get('pytest_failures', 0) - unexplained} failing record(s) explain them:"
            f" {unexplained} failure(s) (a collection error, a non-case test, a lost record) "
            "are not in the report"))
    status = session.get("pytest_exit_status")
    if isinstance(status, int) and status not in (0, 1, 5) and session.get("complete", True):
        res.problems.append(("unexplained", f"pytest exited with status {status}: the run "
                             "itself did not finish normally"))


def check_exit_status(res: GateResult, status: int, report: dict[str, Any]) -> None:
    """``--pytest-status``: the gate is never more positive than pytest's own exit status. A
    status 1 must be explained by failing records, anything but 0/1/5 fails the gate."""
    if any(k == "unexplained" for k, _ in res.problems):
        return  # the report's own session block already says it
    records = report.get("records", [])
    failing = sum(r.get("outcome") in BAD for r in records)
    if status == 1 and not failing:
        res.problems.append(("unexplained", "pytest exited with status 1 but no record failed:"
                             " the failure (a collection error, a non-case test, a lost "
                             "record) is not in the report; see the pytest log"))
    elif status == 5 and executed(report):
        res.problems.append(("unexplained", f"pytest exited with status 5 (nothing ran) but "
                             f"the report holds {executed(report)} instance(s) that ran: it is"
                             " not the report of that run"))
    elif status not in (0, 1, 5):
        res.problems.append(("unexplained", f"pytest exited with status {status} "
                             "(interrupted, internal or usage error): the run is not complete"))


# -- rendering ---------------------------------------------------------------------------------

ORDER = ("regression", "new_failure", "missing", "newly_skipped", "fixed", "changed", "new")
# The failing categories, listed as their causes (harness.gate.causes) instead of one line each.
BY_CAUSE = ("regression", "new_failure")


def render_text(res: GateResult, max_list: int = 200) -> str:
    """Plain text for a terminal: the verdict first, then each non-trivial category."""
    lines = [f"collective-gate: {res.verdict()}"]
    lines += [f"  {'FAIL' if k in res.failing() else 'WARN'}: {m}" for k, m in res.problems]
    if res.across_versions:  # named before anything else: it changes what the verdict means
        lines.insert(0, f"collective-gate: {res.across_versions} (different versions)")
    if res.report_label or res.baseline_label:
        lines.append(f"  report {res.report_label} vs baseline {res.baseline_label}")
    lines += [f"  {n}" for n in res.notes]
    for cat in ORDER:
        items = res.of(cat)
        level = res.policy.get(cat, "ok")
        if not items:
            continue
        lines.append("")
        if cat in BY_CAUSE:
            lines += _text_by_cause(TITLES[cat], level, items, max_list)
            continue
        lines.append(f"{TITLES[cat]} ({len(items)}, policy {level}):")
        lines += [f"  {c.line()}" for c in items[:max_list]]
        if len(items) > max_list:
            lines.append(f"  ... and {len(items) - max_list} more (see --json)")
    if res.of("fixed") or res.of("new"):
        lines.append("")
        lines.append(f"To lock in fixes and new instances, refresh the baseline: "
                     f"{res.refresh_hint or bl.REFRESH_HINT}")
    # Keys, reasons and labels come from the report: one printed line each, whatever they hold.
    return "\n".join(printable(line) for line in lines) + "\n"


def _text_by_cause(title: str, level: str, items: list[Change], max_list: int) -> list[str]:
    """A failing category as its causes, largest first: count, cause, a few instances."""
    groups = causes.group(items)
    lines = [f"{title} ({len(items)}, policy {level}), {len(groups)} cause(s), largest first:"]
    for g in groups[:max_list]:
        lines.append(f"  {len(g.items)} x {g.cause}")
        # The first instance with its own reason (the values the key made general).
        lines += [f"      {c.line(reason=i == 0)}" for i, c in enumerate(g.examples())]
        if len(g.items) > causes.EXAMPLES:
            lines.append(f"      ... and {len(g.items) - causes.EXAMPLES} more of this cause")
    if len(groups) > max_list:
        rest = sum(len(g.items) for g in groups[max_list:])
        lines.append(f"  ... and {len(groups) - max_list} more cause(s), {rest} instance(s) "
                     "(see --json)")
    return lines


def _md_escape(text: str) -> str:
    text = printable(" ".join(text.split()))  # a newline would start a new block
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|").replace("`", "'"))


def _md_change(c: Change, with_reason: bool = True) -> str:
    where = f" ({c.where})" if c.where else ""
    reason = f" — {_md_escape(c.reason)}" if c.reason and with_reason else ""
    return (f"`{_md_escape(c.key)}`{where}: {c.was or 'absent'} → {c.now or 'absent'}"
            f"{reason}")


def _md_by_cause(items: list[Change], max_list: int) -> list[str]:
    groups = causes.group(items)
    out = [f"{len(groups)} cause(s), largest first:", ""]
    for g in groups[:max_list]:
        out.append(f"- **{len(g.items)}** x `{_md_escape(g.cause)}`")
        out += [f"  - {_md_change(c, with_reason=i == 0)}" for i, c in enumerate(g.examples())]
        if len(g.items) > causes.EXAMPLES:
            out.append(f"  - … and {len(g.items) - causes.EXAMPLES} more of this cause")
    if len(groups) > max_list:
        out.append(f"- … and {len(groups) - max_list} more cause(s) (see the gate's JSON "
                   "artifact)")
    out.append("")
    return out


def render_markdown(res: GateResult, max_list: int = 100) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY`` and PR comments: verdict heading first."""
    icon = "✅" if res.ok and not res.warning() else ("⚠️" if res.ok else "❌")
    out = [f"## {icon} Conformance gate: {_md_escape(res.verdict())}", ""]
    if res.across_versions:
        out[0] = (f"## {icon} Conformance gate across versions "
                  f"({_md_escape(res.across_versions)}): {_md_escape(res.verdict())}")
    out += [f"> **{'FAIL' if k in res.failing() else 'WARN'}**: {_md_escape(m)}"
            for k, m in res.problems]
    if res.problems:
        out.append("")
    if res.report_label or res.baseline_label:
        out += [f"Report `{res.report_label}` vs baseline `{res.baseline_label}`; "
                + "; ".join(res.notes) + ".", ""]
    for cat in ORDER:
        items = res.of(cat)
        if not items:
            continue
        out.append(f"### {TITLES[cat]} ({len(items)}, policy {res.policy.get(cat, 'ok')})")
        out.append("")
        if cat in BY_CAUSE:
            out += _md_by_cause(items, max_list)
            continue
        out += [f"- {_md_change(c)}" for c in items[:max_list]]
        if len(items) > max_list:
            out.append(f"- … and {len(items) - max_list} more (see the gate's JSON artifact)")
        out.append("")
    return "\n".join(printable(line) for line in out).rstrip() + "\n"


def to_json(res: GateResult) -> dict[str, Any]:
    """Machine-readable result (``--json``)."""
    return {"ok": res.ok, "verdict": res.verdict(), "counts": res.counts(),
            "policy": res.policy, "failing": res.failing(), "warning": res.warning(),
            "agnostic": res.agnostic, "report_backends": res.report_backends,
            "baseline_backends": res.baseline_backends,
            "problems": [{"key": k, "message": m} for k, m in res.problems],
            "across_versions": res.across_versions,
            "changes": [c.__dict__ for c in res.changes if c.category != "unchanged"],
            "causes": {cat: [{"cause": g.cause, "count": len(g.items),
                              "examples": [c.key for c in g.examples()]}
                             for g in causes.group(res.of(cat))] for cat in BY_CAUSE}}
