"""Translated calls -> a case file a person can read.

Repeated calls collapse: every call with the same signature (op, group, dtype, reduce op,
root, async, layout, form) becomes one case, its recorded shapes one ``shape`` axis, so each
distinct call is one instance; the description says how often and from where (file:line) it
was issued and where its Work was waited. Point-to-point calls are matched send-to-recv and
become small programs (the receiver's buffer must hold the sender's data). Inputs use the
harness's own generators and ``expected: auto`` (its reference model).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from harness.record.optable import Call
from harness.record.worlds import generalize

_FLOATS = {"float16", "bfloat16", "float32", "float64"}
_INTS = {"int8", "uint8", "int16", "int32", "int64", "bool"}
ROOTED = {"broadcast", "scatter", "reduce", "gather"}


@dataclass
class Recording:
    """What the writer needs: the calls per rank, and what went wrong while recording."""

    world_size: int
    calls: list[Call]
    source: str  # the launch command or trace files, for the header comment
    partial: list[str] = field(default_factory=list)  # one line per way it is incomplete
    unknown: list[str] = field(default_factory=list)  # ops skipped by --skip-unknown
    lacks: list[str] = field(default_factory=list)  # what the trace could not tell
    notes: list[str] = field(default_factory=list)  # calls an import could not replay
    world_sizes: list[int] = field(default_factory=list)  # other sizes asked (--world-size)
    # rank -> (calls issued before it, seq of the call waited) per seen wait, in order
    waits: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


def calls_in(calls: list[Call]) -> int:
    """How many calls these stand for (a trace counts a repeated call once, with its count)."""
    return sum(c.count for c in calls)


def ranks_text(ranks: list[int]) -> str:
    ranks = sorted(set(ranks))
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def sites_text(calls: list[Call]) -> str:
    count: Counter[tuple[str, str | None]] = Counter()
    for c in calls:
        count[(c.site, c.api)] += c.count
    parts = []
    for (site, api), n in sorted(count.items()):
        short = re.sub(r"^.*/", "", site)
        if api == "":  # imported: the trace does not say which function issued it
            parts.append(f"{short} ({n}x)")
            continue
        how = f"torch.distributed.{api}" if api else "issued from C++ (DDP's Reducer)"
        parts.append(f"{short} ({how}, {n}x)")
    return "; ".join(parts)


def _waits(calls: list[Call]) -> str:
    waited: Counter[str] = Counter()
    for c in calls:
        waited.update(dict(c.waits))
    if not waited:
        return ""
    top, n = waited.most_common(1)[0]
    more = f" and {len(waited) - 1} other place(s)" if len(waited) > 1 else ""
    return f" Waited {top} ({n}x){more}."


def unique_name(parts: list[str], used: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", "_".join(p for p in parts if p)).strip("_")
    name, k = base, 2
    while name in used:
        name, k = f"{base}_{k}", k + 1
    used.add(name)
    return name


def _input(c: Call) -> dict[str, Any]:
    if c.op in {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"}:
        return {"generator": "exact", "seed": 1}
    return {"generator": "ranks"}


def _collective_cases(calls: list[Call], world: int, used: set[str]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[Call]] = defaultdict(list)
    for c in calls:
        # a group of the world's ranks that new_group made is kept apart from the default one
        group = c.group if c.own_group or list(c.group) != list(range(world)) else ()
        key = (c.op, group, c.dtype, c.reduce_op, c.root, c.async_op, c.layout, c.form,
               c.device)
        groups[key].append(c)
    out = []
    for (op, group, dtype, reduce_op, root, async_op, layout, form, device), cs in sorted(
            groups.items(), key=lambda kv: min(c.seq for c in kv[1])):
        shapes = sorted({c.shape for c in cs}, key=lambda s: (len(s), s))
        case: dict[str, Any] = {
            "name": unique_name([op, dtype if op not in {"barrier", "monitored_barrier"} else "",
                           reduce_op or "", f"g{'_'.join(map(str, group))}"
                           if group else "",
                           "async" if async_op else ""], used),
            "description": (f"Recorded: {op} issued {calls_in(cs)} time(s) by "
                            f"{ranks_text([c.rank for c in cs])} at {sites_text(cs)}."
                            f"{_waits(cs)}"),
            "op": op,
            "world_size": world,
        }
        if op not in {"barrier", "monitored_barrier"}:
            case["dtype"] = dtype
            case["shape"] = [list(s) for s in shapes] if len(shapes) > 1 else list(shapes[0])
            case["input"] = _input(cs[0])
        if reduce_op and op != "barrier":
            case["reduce_op"] = reduce_op
        if async_op:
            case["async"] = True
        if layout != "contiguous":
            case["layout"] = "transposed"
        if device == "cuda":
            case["device"] = "cuda"
        args: dict[str, Any] = {}
        if group:
            args["group"] = list(group)
        if root is not None:
            args["src" if op in {"broadcast", "scatter"} else "dst"] = root
        elif op in ROOTED:  # the trace did not say: every member is tried as the root
            args["src" if op in {"broadcast", "scatter"} else "dst"] = list(
                group or range(world))
            case["description"] += " The trace has no root: every rank is tried."
        if form == "stack":
            args["form"] = "stack"
        if args:
            case["args"] = args
        case["expected"] = "auto"
        out.append(case)
    return out


def _match(ss: list[Call], rs: list[Call]) -> tuple[list[tuple[Call, Call]], list[Call]]:
    """Sends paired with receives in order, each call standing for ``count`` messages (a
    counted call is split where it meets calls of other counts; its waits stay with its first
    part), and what is left unmatched."""
    out: list[tuple[Call, Call]] = []
    i = j = 0
    sn = ss[0].count if ss else 0
    rn = rs[0].count if rs else 0
    while i < len(ss) and j < len(rs):
        n = min(sn, rn)
        out.append((_part(ss[i], sn, n), _part(rs[j], rn, n)))
        sn, rn = sn - n, rn - n
        if not sn:
            i += 1
            sn = ss[i].count if i < len(ss) else 0
        if not rn:
            j += 1
            rn = rs[j].count if j < len(rs) else 0
    if i < len(ss):
        return out, [_part(ss[i], sn, sn), *ss[i + 1:]]
    if j < len(rs):
        return out, [_part(rs[j], rn, rn), *rs[j + 1:]]
    return out, []


def _part(c: Call, left: int, n: int) -> Call:
    if left == c.count and n == c.count:
        return c
    return replace(c, count=n, waits=c.waits if left == c.count else ())


def _p2p_cases(calls: list[Call], world: int, used: set[str]) -> tuple[list[dict[str, Any]],
                                                                       list[str]]:
    sends: dict[tuple[int, int, int], list[Call]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[Call]] = defaultdict(list)
    loose: list[str] = []
    for c in calls:
        if c.op == "send" and c.peer is not None:
            sends[(c.rank, c.peer, c.tag)].append(c)
        elif c.op == "recv" and c.peer is not None:
            recvs[(c.peer, c.rank, c.tag)].append(c)
        else:
            loose.append(f"recv from any source on rank {c.rank} at {c.site}")
    pairs: dict[tuple[Any, ...], list[tuple[Call, Call]]] = defaultdict(list)
    for key in sorted(set(sends) | set(recvs)):
        matched, rest = _match(sends.get(key, []), recvs.get(key, []))
        for s, r in matched:
            pairs[(s.rank, r.rank, s.tag, s.shape, s.dtype, s.async_op, r.async_op,
                   s.device)].append((s, r))
        for c in rest:
            loose.append(f"unmatched {c.op} on rank {c.rank} (peer {c.peer}) at {c.site}"
                         + (f" ({c.count}x)" if c.count > 1 else ""))
    out = []
    for (src, dst, tag, shape, dtype, s_async, r_async, device), ps in pairs.items():
        both = [p[0] for p in ps] + [p[1] for p in ps]
        init = {src: {"generator": "ranks"}, "others": "zeros"}
        steps: list[dict[str, Any]] = [
            {"op": "isend" if s_async else "send", "tensor": "buf", "dst": dst, "ranks": [src]},
            {"op": "irecv" if r_async else "recv", "tensor": "buf", "src": src, "ranks": [dst]},
        ]
        for step, is_async in zip(steps, (s_async, r_async), strict=True):
            if tag:
                step["tag"] = tag
            if is_async:
                step["handle"] = "h"
        if s_async or r_async:
            steps.append({"wait": "h", "ranks": [r for r, a in ((src, s_async),
                                                                (dst, r_async)) if a]})
        tensor: dict[str, Any] = {"shape": list(shape), "dtype": dtype, "init": init}
        if device == "cuda":
            tensor["device"] = "cuda"
        out.append({
            "name": unique_name(["p2p", dtype, f"{src}to{dst}", f"tag{tag}" if tag else ""], used),
            "description": (f"Recorded: {calls_in([p[0] for p in ps])} message(s) rank {src} "
                            f"-> rank {dst} "
                            f"({dtype}, shape {list(shape)}) at {sites_text(both)}.{_waits(both)}"),
            "world_size": world,
            "tensors": {"buf": tensor},
            "steps": steps,
            "expected": {"buf": {src: "unchanged", dst: {"generator": "ranks", "rank": src},
                                 "others": "unchanged"}},
        })
    return out, loose


def build(rec: Recording) -> tuple[dict[str, Any], list[str]]:
    """The case document and the notes for its header (what was not replayed and why)."""
    used: set[str] = set()
    p2p = [c for c in rec.calls if c.op in {"send", "recv"}]
    coll = [c for c in rec.calls if c.op not in {"send", "recv"}]
    notes = []
    uneven = [c for c in coll if c.op == "all_to_all_single" and c.splits
              and len(set(c.splits)) > 1]
    if uneven:
        notes.append(f"not replayed: {calls_in(uneven)} all_to_all_single call(s) with uneven "
                     "splits (the case would need every rank's splits matrix)")
        coll = [c for c in coll if c not in uneven]
    cases = _collective_cases(coll, rec.world_size, used)
    pcases, loose = _p2p_cases(p2p, rec.world_size, used)
    notes += [f"not replayed: {line}" for line in loose + rec.notes]
    notes += generalize(cases + pcases, rec.world_size, rec.world_sizes)
    return {"cases": cases + pcases}, notes


Builder = Callable[[Recording], tuple[dict[str, Any], list[str]]]


def render(rec: Recording, builder: Builder = build) -> str:
    """The case file's text: a header comment (source, partial, not replayed), then YAML;
    ``builder`` makes the cases (:func:`build`: one instance per distinct call)."""
    doc, notes = builder(rec)
    head = [f"# Recorded by collective-record from: {rec.source}",
            f"# {calls_in(rec.calls)} call(s) at world size {rec.world_size} -> "
            f"{len(doc['cases'])} case(s). Regenerate rather than edit."]
    if rec.partial:
        head.append("# PARTIAL recording: the cases do not cover every call the run made; "
                    "what is missing:")
        head += [f"#   {line}" for line in rec.partial]
    head += [f"# {line}" for line in notes]
    head += [f"# not translated (op table lacks it): {u}" for u in rec.unknown]
    head += [f"# the trace lacked: {line}" for line in rec.lacks]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=96)
    return "\n".join(_escape(h) for h in head) + "\n" + body


def _escape(line: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in line)
