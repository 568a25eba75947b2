"""Build the JSON-ready record of one instance, and the report document around the records."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import os
import tempfile
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

from .. import schemacheck
from ..errors import trim_traceback
from ..model import OUTCOMES, Instance, InstanceResult
from ..perf import stats as perfstats
from . import costs, headline
from .jsonfile import UnreadableFile, printable, read_json

SCHEMA_VERSION = 1


def clean(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8: a lone surrogate (from a case's
    description, an exception message, a reason) becomes a visible ``\\udcxx`` escape, so
    that writing a report never fails on content."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def instance_record(inst: Instance, result: InstanceResult, nodeid: str) -> dict[str, Any]:
    """The report record of one instance (see harness/schemas/report.schema.json)."""
    states = {s.rank: s for s in result.states}
    ranks: list[dict[str, Any]] = []
    for rank in range(inst.world_size):
        rr = next((r for r in result.ranks if r.rank == rank), None)
        st = states.get(rank)
        entry: dict[str, Any] = {"rank": rank, "status": rr.status if rr else "no_result"}
        if st is not None:
            entry["state"] = st.state
            entry["step"] = st.step
            if st.step_desc:
                entry["step_desc"] = st.step_desc
            if st.stack:
                entry["stack"] = st.stack
            if st.exitcode is not None:
                entry["exitcode"] = st.exitcode
            if st.signal:
                entry["signal"] = st.signal
            if st.stderr_tail:
                entry["stderr_tail"] = st.stderr_tail
            if st.flight_recorder:
                entry["flight_recorder"] = st.flight_recorder
        if rr is not None:
            entry["duration_s"] = round(rr.duration, 6)
            entry["checks"] = [_check_entry(c) for c in rr.checks]
            entry["events"] = [_compact(dataclasses.asdict(e)) for e in rr.events]
            if rr.ordering:
                entry["ordering"] = rr.ordering
            if rr.timing:  # blocks_until_all: the raw clock readings behind the verdict
                entry["timing"] = rr.timing
            if rr.perf and result.perf:
                entry["perf"] = {k: [round(t, 9) for t in v] if k == "times_s" else v
                                 for k, v in rr.perf.items()}
            if rr.status == "raised":
                # An error the case expected (outcome "passed") needs no traceback: the type and
                # message say what was raised, and a library of expected rejections would
                # otherwise fill the report with identical stacks.
                entry["exception"] = {"type": rr.exc_type, "message": rr.exc_message,
                                      "traceback": "" if result.outcome in ("passed",
                                                                            "limitation")
                                      else trim_traceback(rr.traceback), "step": rr.step}
        ranks.append(entry)
    record: dict[str, Any] = {
        "key": inst.key,
        "nodeid": nodeid,
        "file": inst.file,
        "line": inst.line,
        "case": inst.case,
        "id": inst.id,
        "description": inst.description,
        "backend": inst.backend,
        "device": inst.device,
        "world_size": inst.world_size,
        "dtype": inst.dtype,
        "op": inst.op,
        "family": inst.family,
        **({"issued": [{"op": o, "family": f} for o, f in inst.issued]} if inst.issued else {}),
        "reduce_op": inst.reduce_op,
        "async": inst.async_op,
        "axes": {k: v for k, v in inst.axes},
        "outcome": result.outcome,
        "expected": result.expected_kind,
        "reason": result.reason,
        "message": result.message,
        "duration_s": round(result.duration, 6),
        "pool_replaced": result.pool_replaced,
        **({"pool_replaced_why": result.pool_replaced_why}
           if result.pool_replaced and result.pool_replaced_why else {}),
        **({"ran_ahead": True} if result.ran_ahead else {}),
        **({"fresh_rerun": result.fresh_rerun} if result.fresh_rerun else {}),
        **({"phases": result.phases} if result.phases else {}),
        "ranks": ranks,
    }
    if result.ordering:
        record["ordering"] = result.ordering
    if result.perf:
        record["perf"] = result.perf
    if result.numerics:
        record["numerics"] = result.numerics
    if result.harness_error:
        record["harness_error"] = result.harness_error
    if result.deaths:  # a program through a failure: every rank accounted
        record["deaths"] = result.deaths["deaths"]
        record["survivors"] = result.deaths["survivors"]
    if result.outcome != "skipped":  # judged: what it compared, even if that is nothing
        record["evidence"] = result.evidence
    if inst.unchecked:  # written by an op, compared by nothing: said, never silent
        record["not_checked"] = [{"buffer": n, "reason": why or "not stated by the case"}
                                 for n, why in inst.unchecked]
    if inst.expectation.applied:
        exp = inst.expectation
        record["overrides_applied"] = [
            {"line": line, "reason": reason, "patched": list(keys),
             **({"inherited": True} if line in exp.inherited else {}),
             **({"every_backend": True} if line in exp.every_backend else {})}
            for line, reason, keys in exp.applied]
    if inst.needs:  # filed by the certificate under each (harness.manifest.needs)
        record["needs"] = list(inst.needs)
    if inst.expectation.unsupported:  # must be rejected, as the backend's manifest declares
        record["unsupported"] = list(inst.expectation.unsupported)
    if result.overrides_not_applied:
        record["overrides_not_applied"] = result.overrides_not_applied
    return dict(clean(record))


def _compact(values: dict[str, Any]) -> dict[str, Any]:
    """Drop unset fields and round times to microseconds: reports of thousands of instances
    stay small enough to commit and to upload as CI artifacts."""
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in values.items()
            if v is not None}


def _check_entry(c: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"tensor": c.tensor, "ok": c.ok, "expectation": c.expectation,
                             "wrong": c.wrong, "total": c.total, "digest": c.digest}
    if c.note:
        entry["note"] = c.note
    # Error against FP64 (harness.program.fp64); an all-zero one only in the record's numerics
    if any(c.error.values()):
        entry["error"] = {k: float(f"{v:.4g}") for k, v in c.error.items()}
    if c.inexact:
        entry["inexact"] = c.inexact
    if c.beyond_order:
        entry["beyond_order"] = c.beyond_order
    for key in ("rounded_error", "order_error"):
        if getattr(c, key):
            entry[key] = {k: float(f"{v:.4g}") for k, v in getattr(c, key).items()}
    if c.first_wrong:
        entry["first_wrong"] = [{"index": i, "expected": e, "got": g}
                                for i, e, g in c.first_wrong]
    return entry


def skipped_record(inst: Instance, reason: str, nodeid: str) -> dict[str, Any]:
    """Record for an instance skipped in the parent (no rank ran)."""
    return instance_record(inst, InstanceResult("skipped", reason, reason=reason), nodeid)


@functools.cache
def report_schema() -> dict[str, Any]:
    """The JSON Schema of the conformance report."""
    text = resources.files("harness").joinpath("schemas/report.schema.json").read_text()
    return dict(json.loads(text))


def build_report(records: list[dict[str, Any]], metadata: dict[str, Any],
                 session: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole report: metadata, summary and records sorted by key (reproducible).

    ``session`` says whether the session was complete (see :mod:`harness.report.headline`);
    without it (a report assembled outside pytest) the records are taken as the whole run."""
    records = sorted(records, key=lambda r: (r["backend"], r["key"]))
    counts = Counter(r["outcome"] for r in records)
    summary: dict[str, Any] = {o: counts.get(o, 0) for o in OUTCOMES}
    summary["total"] = len(records)
    summary["verdict"] = headline.verdict(summary, session)
    summary["ok"] = summary["verdict"] == "PASS"
    summary["headline"] = headline.headline(summary, session)
    summary["overrides_not_applied"] = overrides_not_applied(records)
    summary["time"] = costs.totals(records)
    meta = dict(metadata)
    meta.setdefault("created", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    meta["world_sizes"] = sorted({r["world_size"] for r in records})
    meta["backends"] = sorted({r["backend"] for r in records})
    meta["devices"] = sorted({r["device"] for r in records})
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "metadata": meta,
                           "summary": summary}
    if session is not None:
        out["session"] = session
    out["records"] = records
    perf = perfstats.section(records, meta)
    if perf is not None:
        out["perf"] = perf
    return dict(clean(out))


def overrides_not_applied(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per override that did not apply because of its torch or backend scope, with
    how many instances and which cases it would have covered (for the report header)."""
    seen: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in records:
        for o in r.get("overrides_not_applied", ()):
            k = (r["file"], o["line"], o["scope"])
            entry = seen.setdefault(k, {"file": r["file"], "line": o["line"],
                                        "scope": o["scope"], "when": o.get("when", ""),
                                        "reason": o["reason"], "instances": 0, "cases": []})
            entry["instances"] += 1
            if r["case"] not in entry["cases"]:
                entry["cases"].append(r["case"])
    return [seen[k] for k in sorted(seen)]


@functools.cache
def report_check() -> schemacheck.Check:
    """The fast yes-or-no check of the report schema (:mod:`harness.schemacheck`)."""
    return schemacheck.compile_schema(report_schema())


def validate_report(report: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError if ``report`` does not match the shipped schema.

    The fast check answers first (a fraction of jsonschema's time on a large report);
    only a report it does not accept goes through jsonschema, which decides and says why."""
    if not report_check()(report):
        import jsonschema  # only to word a refusal: 40 ms to import, off every session's path

        jsonschema.Draft202012Validator(report_schema()).validate(report)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so readers never see a half-written file."""
    write_all([(path, text)])


def json_text(report: dict[str, Any]) -> str:
    """The report as JSON text (validated): one record per line, compact, yet diffs and grep
    stay readable (jq pretty-prints)."""
    validate_report(report)
    head = {k: v for k, v in report.items() if k != "records"}
    lines = [json.dumps(r, separators=(",", ":")) for r in report["records"]]
    return (json.dumps(head, indent=1)[:-2] + ',\n "records": [\n' + ",\n".join(lines)
            + "\n ]\n}\n")


def write_json(path: str, report: dict[str, Any]) -> None:
    write_atomic(path, json_text(report))


def write_all(files: list[tuple[str, str]]) -> None:
    """Write several files as one set: every text goes to a temporary file beside its target
    first, and the targets are replaced only once all were written, so a failure leaves the
    previous set in place (and no temporary file behind) rather than a mix of old and new."""
    done: list[tuple[str, str]] = []
    try:
        for path, text in files:
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-",
                                       suffix=os.path.basename(path))
            done.append((tmp, path))
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
                fh.write(text)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is meant to be shared
    except BaseException:
        for tmp, _ in done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for n, (tmp, path) in enumerate(done):
        try:
            os.replace(tmp, path)
        except OSError:  # e.g. the target is a directory: leave no temporary file behind
            for left, _ in done[n:]:
                with contextlib.suppress(OSError):
                    os.unlink(left)
            raise


def load_report(path: str, missing_hint: str = "") -> dict[str, Any]:
    """Read and validate a report written by :func:`write_json` (``.json``, or ``.json.gz``
    as the committed references are); :class:`UnreadableFile` (one line naming the file) for
    anything else, ``missing_hint`` following the message of a missing file."""
    import jsonschema  # see validate_report

    report = read_json(path, "report", missing_hint)
    try:
        validate_report(report)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise UnreadableFile(f"{path}: not a collective-harness report: at "
                             f"{printable(where, 100)}: {printable(exc.message, 200)}") from None
    return dict(report)
