"""The report's verdict and headline: what is true at a glance, in one line.

``PASS`` means nothing unexpected happened and the session is complete: every collected
instance has a result, none failed, errored, hung or crashed, and no declared failure passed
(xpass). ``INCOMPLETE`` wins over everything: a session stopped early (Ctrl-C, SIGTERM, ``-x``,
``--maxfail``, a crash) never reads PASS for what happened to run. ``NOTHING RAN`` is a complete
session without a failure in which no instance was executed (none collected, every one
deselected or skipped): a verdict needs at least one instance whose ranks ran and were judged,
so a misspelt backend or a missing capability never reads PASS. The headline counts what each
outcome means: conformant instances (the backend did what the contract says), known divergences
(xfail), limitations (rejected, crashed, hung or computed exactly what an override declares),
failures.
"""

from __future__ import annotations

from typing import Any

from ..model import BAD_OUTCOMES as BAD
from ..model import OUTCOMES
from ..model import UNEXPECTED_OUTCOMES as UNEXPECTED

NOTHING_RAN = "NOTHING RAN"
VERDICTS = ("PASS", "FAIL", "INCOMPLETE", NOTHING_RAN)


def executed(summary: dict[str, Any]) -> int:
    """How many instances ran and were judged: every outcome but ``skipped`` (counted from the
    outcomes, not ``total``, so a bare count of outcomes answers the same)."""
    return sum(summary.get(o, 0) for o in OUTCOMES if o != "skipped")


def verdict(summary: dict[str, Any], session: dict[str, Any] | None) -> str:
    """``PASS``, ``FAIL``, ``INCOMPLETE`` or ``NOTHING RAN`` (see the module docstring)."""
    if session is not None and not session.get("complete", True):
        return "INCOMPLETE"
    if any(summary.get(o, 0) for o in UNEXPECTED):
        return "FAIL"
    if session is not None and session.get("unexplained_failures", 0):
        return "FAIL"
    if not executed(summary):
        return NOTHING_RAN
    return "PASS"


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


def counts_text(summary: dict[str, Any]) -> str:
    """``1,441 conformant, 45 known divergences (xfail), 504 limitations, 0 failures``."""
    bad = {o: summary.get(o, 0) for o in BAD if summary.get(o, 0)}
    fails = _n(sum(bad.values()), "failure")
    if bad:
        fails += " (" + ", ".join(f"{n:,} {o}" for o, n in bad.items()) + ")"
    parts = [f"{summary.get('passed', 0):,} conformant",
             _n(summary.get("xfail", 0), "known divergence") + " (xfail)",
             _n(summary.get("limitation", 0), "limitation"), fails]
    if summary.get("uncheckable", 0):  # neither a pass nor a failure (harness.verdict.numerics)
        parts.insert(3, f"{summary['uncheckable']:,} uncheckable")
    if summary.get("xpass", 0):
        parts.append(_n(summary["xpass"], "unexpected pass", "unexpected passes") + " (xpass)")
    if summary.get("skipped", 0):
        parts.append(f"{summary['skipped']:,} skipped")
    return ", ".join(parts)


def headline(summary: dict[str, Any], session: dict[str, Any] | None) -> str:
    """``PASS: 2,030 instances: 1,441 conformant, ...; nothing unexpected``."""
    word = verdict(summary, session)
    total = summary.get("total", 0)
    unexpected = sum(summary.get(o, 0) for o in UNEXPECTED)
    tail = "nothing unexpected" if not unexpected else _n(unexpected, "unexpected result")
    if word == NOTHING_RAN:
        tail = nothing_ran_text(summary, session)
    if session is not None and session.get("unexplained_failures", 0):
        tail += (f"; pytest reported {_n(session['unexplained_failures'], 'failure')} that no "
                 "record explains")
    subset = selection_text(session)
    if subset:
        tail += f"; {subset}"
    if word == "INCOMPLETE" and session is not None:
        return (f"INCOMPLETE: {incomplete_text(session)}. Of the {total:,} with a result: "
                f"{counts_text(summary)}; {tail}")
    return f"{word}: {total:,} instances: {counts_text(summary)}; {tail}"


def nothing_ran_text(summary: dict[str, Any], session: dict[str, Any] | None) -> str:
    """``no instance was executed: all 68 were skipped (each record says why)``, or that none
    was collected (``3 deselected``): why a NOTHING RAN report says nothing about a backend."""
    total = summary.get("total", 0)
    if total:
        which = "the one instance was" if total == 1 else f"all {total:,} were"
        return f"no instance was executed: {which} skipped (each record says why)"
    deselected = ((session or {}).get("selection") or {}).get("deselected", 0)
    return ("no instance was executed: none was collected"
            + (f" ({deselected:,} deselected)" if deselected else ""))


def selection_text(session: dict[str, Any] | None) -> str:
    """``only a selection ran (-k all_reduce, --lf): not the whole suite`` when the person
    chose a subset; "" for the default selection (leaving out --full is not a choice of
    subset: it is the quick suite)."""
    sel = (session or {}).get("selection") or {}
    parts = []
    if sel.get("keyword"):
        parts.append(f"-k {sel['keyword']}")
    if sel.get("markexpr"):
        parts.append(f"-m {sel['markexpr']}")
    if sel.get("world_sizes"):
        parts.append("--world-size " + ",".join(map(str, sel["world_sizes"])))
    if sel.get("last_failed"):
        parts.append("--lf")
    if sel.get("node_ids"):
        parts.append("single instances named by id")
    return f"only a selection ran ({', '.join(parts)}): not the whole suite" if parts else ""


def incomplete_text(session: dict[str, Any]) -> str:
    """``284 of 2,030 collected instances have a result (1,746 without); the session ended:
    interrupted (Ctrl-C)``."""
    collected = session.get("collected", 0)
    missing = session.get("without_result", 0)
    have = max(collected - missing, 0)
    return (f"{have:,} of {collected:,} collected instances have a result ({missing:,} "
            f"without); the session ended: {session.get('ended_by') or 'unknown'}")
