"""Findings the ranks wrote -> case files ``pytest findings/`` replays (the parent's side).

Each rank appends one JSON line per mismatch it decided (``findings-PID.jsonl``) and a
``stats-PID.json`` when it stops; under ``--keep-inputs`` every rank of a collective call
found wrong also appends its input (``inputs-PID.jsonl``). All are read as plain JSON with
bounded sizes (never unpickled, never trusted for more than their fields); a line that does
not parse, a torn last line of a crashed rank included, is skipped and counted. Every
distinct call found wrong (group, op, sequence number) becomes one case file: the call's op,
shape, dtype, group and reduce op as the recorder would write them
(:mod:`harness.record.cases`), with the finding, its training step and call number, the ranks
and chunks, and the digests in its header comment. Its inputs are every rank's own where all
of them were kept (then it replays the job's exact bytes), else the harness's generated
inputs: on the same node and backend it tries to reproduce the fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.record.cases import Builder, Recording, build, render
from harness.record.optable import Call, UnknownOp, translate

MAX_FILE_BYTES = 64 << 20
MAX_FINDINGS = 1000  # case files written at most; the rest are counted
DIGEST_CHARS = 2000  # of the digests quoted in a case file's header
FLOATS = {"float16", "bfloat16", "float32", "float64"}


@dataclass
class Read:
    """What the ranks left: findings, per-rank stats, lines that could not be read."""

    findings: list[dict[str, Any]] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)
    inputs: dict[tuple[Any, ...], dict[int, list[Any]]] = field(default_factory=dict)
    skipped: int = 0


def _lines(path: Path) -> list[str]:
    with path.open("rb") as f:
        data = f.read(MAX_FILE_BYTES)
    return data.decode("utf-8", "replace").splitlines()


def read_folder(folder: Path) -> Read:
    """Every finding and stats record under ``folder`` (unreadable lines counted)."""
    out = Read()
    for path in sorted(folder.glob("findings-*.jsonl")):
        for line in _lines(path):
            try:
                rec = json.loads(line)["finding"]
                if not isinstance(rec, dict) or not isinstance(rec.get("call"), dict):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                out.skipped += 1
                continue
            out.findings.append(rec)
    for path in sorted(folder.glob("inputs-*.jsonl")):
        for line in _lines(path):
            try:
                rec = json.loads(line)["inputs"]
                key = (str(rec["group_name"]), str(rec["op"]), int(rec["seq"]))
                if not isinstance(rec["values"], list):
                    raise TypeError
                out.inputs.setdefault(key, {})[int(rec["rank"])] = rec["values"]
            except (ValueError, KeyError, TypeError):
                out.skipped += 1
    for path in sorted(folder.glob("stats-*.json")):
        try:
            rec = json.loads("\n".join(_lines(path)))
            if isinstance(rec, dict):
                out.stats.append(rec)
        except ValueError:
            out.skipped += 1
    return out


def _calls(f: dict[str, Any]) -> list[Call]:
    """The finding's call on every rank of its group, in the case vocabulary."""
    group = [int(r) for r in f["group"]]
    call = {**f["call"], "site": str(f.get("site", "?")), "seq": int(f["seq"])}
    if f["op"] != "p2p":
        return [c for r in group for c in translate(call, r)]
    recv, spec = call, f["spec"]
    me, peer = int(f["rank"]), group[int(spec["peer"])]
    # The receiver's finding does not hold the sender's call site; api "" makes the case's
    # description say so rather than guess (None would read "issued from C++").
    send = {"op": "c10d::send", "group": group, "api": "", "site": "sender's site not recorded",
            "seq": call["seq"],
            "args": {"tensors": recv["args"]["tensors"], "dst": group.index(me),
                     "tag": recv["args"].get("tag", 0)}}
    return translate(send, peer) + translate(recv, me)


def _header(f: dict[str, Any], inputs: str) -> list[str]:
    lines = [f"Finding of collective-guard: {f['op']} seq {f['seq']} on group {f['group']} "
             f"at {f.get('site')}, reported by rank {f['rank']}",
             f"  issued at training step {f.get('step', '?')} (optimizer steps taken before "
             f"it), call {f.get('ordinal', '?')} of the rank's checked-kind calls; {inputs}"]
    for m in f.get("mismatches", [])[:20]:
        first = f", first differing element {m['first']}" if m.get("first") is not None else ""
        sender = f" from rank {m['sender']}" if m.get("sender") is not None else ""
        lines.append(f"  rank {m['rank']} chunk {m['chunk']} (of {f['spec'].get('chunk')} "
                     f"elements){sender}{first}: {m['what']}")
    digs = json.dumps(f.get("digests"))
    lines.append("digests (per rank, per chunk): " + (digs if len(digs) <= DIGEST_CHARS
                                                       else digs[:DIGEST_CHARS] + " ..."))
    return lines


def _name(f: dict[str, Any]) -> str:
    safe = "".join(ch if ch.isalnum() else "_" for ch in str(f["op"]))[:40]
    return f"{safe}-seq{int(f['seq'])}-rank{int(f['rank'])}.yaml"


def merged(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One finding per call found wrong: the ranks' reports of one collective call (group,
    op, seq) have their mismatches put together."""
    by: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in findings:
        key = (f.get("group_name"), f.get("op"), f.get("seq"),
               f.get("rank") if f.get("op") == "p2p" else None)
        if key in by:
            by[key]["mismatches"] = by[key].get("mismatches", []) + f.get("mismatches", [])
        else:
            by[key] = dict(f)
    return list(by.values())


def write_cases(read: Read, out: Path, source: str) -> tuple[list[Path], list[str]]:
    """One case file per finding under ``out``; returns the files and one line per finding
    that could not be turned into a case (why)."""
    written: list[Path] = []
    problems: list[str] = []
    for f in merged(read.findings)[:MAX_FINDINGS]:
        kept = read.inputs.get((str(f.get("group_name")), str(f.get("op")), f.get("seq")), {})
        try:
            calls = _calls(f)
            world = int(f.get("world") or max(int(r) for r in f["group"]) + 1)
            own = f["op"] != "p2p" and sorted(kept) == sorted(int(r) for r in f["group"])
            text = render(Recording(world_size=world, calls=calls, source=source),
                          _with_inputs(kept) if own else build)
        except (UnknownOp, KeyError, ValueError, TypeError, IndexError) as e:
            problems.append(f"finding {f.get('op')} seq {f.get('seq')}: no case ({e})")
            continue
        note = ("inputs: every rank's own, kept by --keep-inputs" if own else
                "inputs: generated by the harness (the job's were not kept"
                + (" by every rank)" if kept else ")"))
        body = text.split("\n", 2)[2] if text.startswith("# Recorded") else text
        head = "\n".join("# " + _printable(line) for line in _header(f, note))
        path = out / _name(f)
        path.write_text(f"# Replays a call collective-guard found wrong in: {_printable(source)}"
                        f"\n{head}\n{body}", encoding="utf-8")
        written.append(path)
    if len(read.findings) > MAX_FINDINGS:
        problems.append(f"{len(read.findings) - MAX_FINDINGS} more finding(s) not written "
                        f"as cases (at most {MAX_FINDINGS})")
    return written, problems


def _with_inputs(kept: dict[int, list[Any]]) -> Builder:
    """The recorder's case builder, with each rank's kept input as the case's input. A float
    reduction over three ranks or more is then compared within the harness's ``auto`` bound
    (the backend may add in another order than the harness's reference); over two, the one
    addition rounds the same in any order, and the comparison stays bit for bit."""

    def builder(rec: Recording) -> tuple[dict[str, Any], list[str]]:
        doc, notes = build(rec)
        for case in doc["cases"]:
            fill: dict[int | str, Any] = {r: v for r, v in sorted(kept.items())}
            case["input"] = fill | {"others": "zeros"}
            if (case.get("dtype") in FLOATS and case.get("reduce_op") is not None
                    and len(kept) > 2):
                case["tolerance"] = "auto"
        return doc, notes

    return builder


def _printable(line: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in line)
