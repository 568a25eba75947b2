"""Whether a report's records are the evidence its summary and session block claim.

The gate classifies records, and a report could say PASS around records that were removed,
added, duplicated or edited: a summary is only a claim. :func:`problems` recomputes what the
records show and compares it with what the report states; every disagreement is named, and the
gate fails on any of them (they are never a policy choice: a report that contradicts itself
proves nothing). A passed record without evidence (what it compared: harness.verdict.evidence)
is one of them. A session that did not finish is the ``incomplete`` policy key, checked by
:func:`harness.gate.compare.check_session`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..model import OUTCOMES
from ..report import headline
from ..report.jsonfile import printable

LISTED = 5  # offending records named per problem


def _keys(records: list[dict[str, Any]]) -> str:
    shown = ", ".join(printable(r.get("key"), 120) for r in records[:LISTED])
    more = f" and {len(records) - LISTED} more" if len(records) > LISTED else ""
    return shown + more


def problems(report: dict[str, Any]) -> list[str]:
    """Every way the records disagree with the report's session block and summary (empty
    when they agree). ``report`` is a parsed report; its types are the schema's."""
    out: list[str] = []
    records = [r for r in report.get("records") or [] if isinstance(r, dict)]
    session = report.get("session")
    if not isinstance(session, dict):
        out.append("the report has no session block, so nothing says how many instances were "
                   "collected or whether the session finished (a report assembled by hand or "
                   "by another tool); rerun pytest with the collective-harness plugin")
    else:
        collected, without = session.get("collected"), session.get("without_result")
        if isinstance(collected, int) and isinstance(without, int):
            if len(records) != collected - without:
                out.append(f"the session block states {collected} collected instance(s), "
                           f"{without} without a result, so {collected - without} record(s); "
                           f"the report holds {len(records)} (records removed or added after "
                           "the run)")
            if bool(session.get("complete")) != (without == 0):
                out.append(f"the session block contradicts itself: complete is "
                           f"{session.get('complete')} with {without} instance(s) without a "
                           "result")
    unknown = [r for r in records if r.get("outcome") not in OUTCOMES]
    if unknown:
        out.append(f"{len(unknown)} record(s) lack an outcome or have an unknown one "
                   f"({_keys(unknown)}); outcomes are {', '.join(OUTCOMES)}")
    seen: dict[tuple[str, str], int] = Counter(
        (str(r.get("backend")), str(r.get("key"))) for r in records)
    dup = [r for r in records if seen[(str(r.get("backend")), str(r.get("key")))] > 1]
    if dup:
        out.append(f"{len(dup)} records share a key with another record, so one would hide "
                   f"the other ({_keys(dup)})")
    bare = [r for r in records if r.get("outcome") == "passed"
            and not (isinstance(r.get("evidence"), dict) and r["evidence"])]
    if bare:
        out.append(f"{len(bare)} passed record(s) say nothing about what they compared "
                   f"({_keys(bare)}): a pass needs evidence (a report written before records "
                   "carried it, or edited); rerun the suite with this harness")
    out += _summary(report.get("summary"), records, session)
    return out


def _summary(summary: Any, records: list[dict[str, Any]],
             session: dict[str, Any] | None) -> list[str]:
    """The summary's counts and verdict against those the records give."""
    if not isinstance(summary, dict):
        return ["the report has no summary"]
    counts = Counter(str(r.get("outcome")) for r in records)
    wrong = [f"{o}: states {summary.get(o, 0)}, records {counts[o]}" for o in OUTCOMES
             if summary.get(o, 0) != counts[o]]
    if summary.get("total") != len(records):
        wrong.append(f"total: states {summary.get('total')}, records {len(records)}")
    out = []
    if wrong:
        out.append("the summary does not agree with the records (a forged or hand-edited "
                   f"summary): {printable('; '.join(wrong), 400)}")
    actual = {o: counts[o] for o in OUTCOMES}
    verdict = headline.verdict(actual, session if isinstance(session, dict) else None)
    stated = summary.get("verdict")
    if stated is not None and stated != verdict:
        out.append(f"the summary's verdict is {printable(stated, 40)} but the records give "
                   f"{verdict}")
    if summary.get("ok") is True and verdict != "PASS":
        out.append(f"the summary says ok but the records give {verdict}")
    return out
