"""``--granularity program``: the recorded run as step programs, order and waits kept.

Each rank's recording is a sequence of events: its calls in issue order and, between them,
each ``Work.wait()`` / ``wait_tensor`` at the position it was recorded. A *step* is the
repeating period of that sequence: for each rank the period p (up to ``MAX_PERIOD`` events)
and start a whose blocks cover the most events (at least two blocks; ties to the shortest
period) are found; when every rank repeats the same number of times the run splits into
``setup`` (before the repeats: DDP's initial broadcast, a first iteration that differs), one
``step`` program standing for every repetition (they are identical; the case format has no
program-level ``repeat:``, so the description says how often it ran) and ``tail`` (after).
A split is kept only if each part can run alone: every group's members issue the same
collectives in the same order within the part, every send has its receive, every wait
follows its call in the part; otherwise the whole run is one program. No period: one
program.

Within a program, steps follow each rank's order position by position: ranks that issue the
same call at a position share one step; ranks that differ (a pipeline's stages, uneven
shapes) get a step each with ``ranks:``. Every call has its own buffers (the recording holds
no data pointers, so aliasing is not replayed), filled with ``(rank + 1) * (i % 3 + 1)``; an
async call gets a handle and a ``wait`` step where the recorded wait was (a call whose wait
was not seen, such as DDP's Reducer's, is waited after the last step, which the case format
does by default). Expected values are written where they follow exactly from that fill
(all_reduce sum/avg/max/min, broadcast, reduce at the root, all_gather, gather at the root,
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single with even splits, recv on
the world or a subgroup); elsewhere they are left unspecified (the buffer must not be touched
on ranks that do not use it, as for any program).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Any

from harness.record.cases import Recording, ranks_text, sites_text, unique_name
from harness.record.optable import Call

MAX_PERIOD = 256  # the longest step (events per rank) looked for
FILL = "(rank + 1) * (i % 3 + 1)"
_NUMERIC = {"float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32",
            "int64"}


@dataclass(frozen=True)
class Event:
    """A call, or the wait of the call at ``waited`` (an index into the same rank's list)."""

    call: Call | None = None
    waited: int = -1


def _sig(call: Call) -> tuple[Any, ...]:
    return (call.op, call.group, call.own_group, call.shape, call.dtype, call.device,
            call.layout, call.reduce_op, call.root, call.peer, call.tag, call.async_op,
            call.form, call.splits)


def rank_events(calls: list[Call], waits: dict[int, list[tuple[int, int]]]
                ) -> dict[int, list[Event]]:
    """Per rank, calls in issue order with each seen wait at its recorded position (a wait
    recorded after ``after`` calls follows the call whose seq is ``after - 1``)."""
    by_rank: dict[int, list[Call]] = defaultdict(list)
    for c in calls:
        by_rank[c.rank].append(c)
    out: dict[int, list[Event]] = {}
    for rank, cs in sorted(by_rank.items()):
        keyed: list[tuple[int, int, int, Any]] = [(c.seq, 0, n, c) for n, c in enumerate(cs)]
        keyed += [(after - 1, 1, n, seq) for n, (after, seq) in enumerate(waits.get(rank, []))]
        keyed.sort(key=lambda k: (k[0], k[1], k[2]))
        events: list[Event] = []
        where: dict[int, int] = {}  # seq -> index of its last call event
        for _, kind, _, item in keyed:
            if kind == 0:
                where[item.seq] = len(events)
                events.append(Event(call=item))
            elif item in where:  # a wait of a call not recorded as a call is not written
                events.append(Event(waited=where.pop(item)))
        out[rank] = events
    return out


def _ids(events: list[Event]) -> list[int]:
    table: dict[tuple[Any, ...], int] = {}
    out = []
    for n, e in enumerate(events):
        key = _sig(e.call) if e.call is not None else ("wait", n - e.waited)
        out.append(table.setdefault(key, len(table)))
    return out


def period(seq: list[int]) -> tuple[int, int, int]:
    """(start, period, repetitions) of the repeated block covering most of ``seq``; (0,
    len, 1) when nothing repeats."""
    n = len(seq)
    best = (0, n, 1)
    covered = 0
    for p in range(1, min(n // 2, MAX_PERIOD) + 1):
        run = 0
        for i in range(n - p + 1):
            if i < n - p and seq[i] == seq[i + p]:
                run += 1
                continue
            k = (run + p) // p
            if k >= 2 and k * p > covered:
                covered, best = k * p, (i - run, p, k)
            run = 0
    return best


def _consistent(part: dict[int, list[Event]]) -> bool:
    """Can these per-rank event lists run alone: collectives matched within every group,
    every send received, every wait after its call?"""
    per_group: dict[tuple[int, ...], dict[int, list[str]]] = defaultdict(dict)
    p2p: Counter[tuple[int, int, int]] = Counter()
    for rank, events in part.items():
        for n, e in enumerate(events):
            if e.call is None:
                if not 0 <= e.waited < n:
                    return False
                continue
            c = e.call
            if c.op == "send":
                p2p[(rank, c.peer if c.peer is not None else -1, c.tag)] += 1
            elif c.op == "recv":
                if c.peer is None:
                    return False
                p2p[(c.peer, rank, c.tag)] -= 1
            else:
                per_group[c.group].setdefault(rank, []).append(c.op)
    if any(p2p.values()):
        return False
    for group, seqs in per_group.items():
        members = [r for r in group if r in part] if group else list(part)
        if len({tuple(seqs.get(r, [])) for r in members}) > 1:
            return False
    return True


def split(events: dict[int, list[Event]]) -> list[tuple[str, dict[int, list[Event]], int]]:
    """The run as (label, per-rank events, times run): setup/step/tail, or one ``run``."""
    found = {r: period(_ids(es)) for r, es in events.items()}
    times = {k for _, _, k in found.values()}
    whole: list[tuple[str, dict[int, list[Event]], int]] = [("run", events, 1)]
    if len(times) != 1 or times == {1}:
        return whole
    k = times.pop()
    parts: list[tuple[str, dict[int, list[Event]], int]] = []
    for label in ("setup", "step", "tail"):
        part = {}
        for r, es in events.items():
            a, p, _ = found[r]
            start, stop = {"setup": (0, a), "step": (a, a + p),
                           "tail": (a + k * p, len(es))}[label]
            part[r] = [Event(e.call, e.waited - start if e.call is None else -1)
                       for e in es[start:stop]]
        if not _consistent(part):
            return whole
        if any(part.values()):
            parts.append((label, part, k if label == "step" else 1))
    return parts


def _world(group: tuple[int, ...], world: int) -> bool:
    return not group or list(group) == list(range(world))


def _index(index_expr: str) -> str:
    return f"({index_expr} % 3 + 1)" if index_expr == "i" else f"(({index_expr}) % 3 + 1)"


def _fill_at(rank_expr: str, index_expr: str = "i") -> str:
    """FILL as the rank ``rank_expr`` (a number or an expression) wrote it."""
    who = str(int(rank_expr) + 1) if rank_expr.isdigit() else f"({rank_expr} + 1)"
    return f"{who} * {_index(index_expr)}"


def _reduced(c: Call, gsize: int, index_expr: str = "i") -> str | None:
    """The expected value of a reduction of FILL over ``gsize`` consecutive ranks 0..n-1."""
    base = _index(index_expr)
    if c.reduce_op == "sum":
        return f"{gsize * (gsize + 1) // 2} * {base}"
    if c.reduce_op == "avg" and c.dtype in {"float16", "bfloat16", "float32", "float64"}:
        return f"{(gsize + 1) / 2} * {base}"
    if c.reduce_op == "max":
        return f"{gsize} * {base}"
    if c.reduce_op == "min":
        return base
    return None


def _buffers(c: Call, world: int) -> tuple[dict[str, list[Any]], dict[str, str | None]]:
    """(role -> shape, role -> expected expression or None) of one call's step."""
    s = list(c.shape)
    g = len(c.group) if c.group else world
    on_world = _world(c.group, world)
    numel = math.prod(s)
    numeric = c.dtype in _NUMERIC
    if c.op in {"all_reduce"}:
        return {"tensor": s}, {"tensor": _reduced(c, g) if on_world and numeric else None}
    if c.op == "reduce":
        ok = on_world and numeric and _reduced(c, g) is not None
        return {"tensor": s}, {"tensor": f"@{c.root}:" + str(_reduced(c, g)) if ok else None}
    if c.op == "broadcast":
        return {"tensor": s}, {"tensor": _fill_at(str(c.root)) if numeric
                               and c.root is not None else None}
    if c.op in {"send", "recv"}:
        return {"tensor": s}, {"tensor": _fill_at(str(c.peer)) if c.op == "recv" and numeric
                               else None}
    if c.op in {"all_gather_into_tensor", "all_gather", "gather"}:
        out = [g * s[0], *s[1:]] if c.form == "concat" else [g, *s]
        gathered = _fill_at(f"i // {numel}", f"i % {numel}") if on_world and numeric else None
        if c.op == "gather" and gathered is not None:
            gathered = f"@{c.root}:{gathered}"
        return {"input": s, "output": out}, {"output": gathered}
    if c.op == "reduce_scatter_tensor":
        out = [s[0] // g, *s[1:]] if c.form == "concat" else s[1:]
        m = math.prod(out)
        red = _reduced(c, g, f"rank * {m} + i") if on_world and numeric else None
        return {"input": s, "output": out}, {"output": red}
    if c.op == "all_to_all_single":
        chunk = numel // g if g else 0
        even = not c.splits or len(set(c.splits)) == 1
        exp = (_fill_at(f"i // {chunk}", f"rank * {chunk} + i % {chunk}")
               if on_world and numeric and even and chunk else None)
        return {"input": s, "output": s}, {"output": exp}
    if c.op in {"scatter", "reduce_scatter", "all_to_all"}:
        out = s if c.op == "all_to_all" else s[1:]
        return {"input": s, "output": out}, {"output": None}
    return {}, {}  # barrier, monitored_barrier


def _op_step(c: Call, n: int, world: int, tensors: dict[str, Any],
             expected: dict[str, Any], ranks: list[int], waited: bool) -> dict[str, Any]:
    op = c.op
    is_async = c.async_op or waited
    if op in {"send", "recv"}:
        op = ("i" if is_async else "") + op
    step: dict[str, Any] = {"op": op}
    shapes, exps = _buffers(c, world)
    for role, shape in shapes.items():
        name = f"{role[0] if role != 'tensor' else 't'}{n}"
        writes = role != "input" and c.op != "send"
        init: Any = "poison" if role == "output" or c.op == "recv" else FILL
        spec: dict[str, Any] = {"shape": shape, "dtype": c.dtype, "init": init}
        if c.device == "cuda":
            spec["device"] = "cuda"
        tensors[name] = spec
        step[role] = name
        exp = exps.get(role)
        if writes and exp is not None:
            root = None
            if exp.startswith("@"):
                root_text, exp = exp[1:].split(":", 1)
                root = int(root_text)
            per = {r: exp for r in ranks if root is None or r == root}
            if len(per) == world:
                expected[name] = exp
            elif per:
                expected[name] = {**per, "others": "unspecified"}
    if c.group and (c.own_group or not _world(c.group, world)):
        step["group"] = list(c.group)
    if c.root is not None:
        step["src" if c.op in {"broadcast", "scatter"} else "dst"] = c.root
    if c.peer is not None:
        step["dst" if c.op == "send" else "src"] = c.peer
    if c.tag:
        step["tag"] = c.tag
    if c.reduce_op and c.op not in {"barrier", "monitored_barrier"}:
        step["reduce_op"] = c.reduce_op
    if c.form == "stack":
        step["form"] = "stack"
    if is_async and c.op not in {"send", "recv"}:
        step["async"] = True
    if is_async:
        step["handle"] = f"h{n}"
    return step


def program_case(name: str, label: str, part: dict[int, list[Event]], world: int,
                 times: int) -> dict[str, Any]:
    """One program: each position's events, ranks that agree sharing a step."""
    tensors: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    step_of: dict[tuple[int, int], int] = {}  # (rank, event index) -> op step number
    # calls with a recorded wait get a handle even if recorded blocking (a functional
    # collective returns an async tensor that wait_tensor completes)
    waited = {(r, e.waited) for r, es in part.items() for e in es if e.call is None}
    calls: list[Call] = []
    unseen = 0
    for pos in range(max((len(es) for es in part.values()), default=0)):
        same: dict[tuple[Any, ...], list[int]] = {}
        for rank, es in sorted(part.items()):
            if pos >= len(es):
                continue
            e = es[pos]
            key = (("call", _sig(e.call)) if e.call is not None
                   else ("wait", step_of[(rank, e.waited)]))
            same.setdefault(key, []).append(rank)
        for key, ranks in same.items():
            step: dict[str, Any]
            if key[0] == "wait":
                step = {"wait": f"h{key[1]}"}
            else:
                n = len(steps)
                c = part[ranks[0]][pos].call
                assert c is not None
                for r in ranks:
                    step_of[(r, pos)] = n
                    rc = part[r][pos].call
                    assert rc is not None
                    calls.append(rc)
                    unseen += rc.async_op and rc.api is None
                step = _op_step(c, n, world, tensors, expected, ranks,
                                any((r, pos) in waited for r in ranks))
            if len(ranks) < world:
                step["ranks"] = ranks
            steps.append(step)
    n_calls = max(sum(e.call is not None for e in es) for es in part.values())
    n_waits = max(sum(e.call is None for e in es) for es in part.values())
    what = {"setup": "Recorded before the repeated steps", "tail": "Recorded after the "
            "repeated steps", "run": "The whole recorded run (no repeating step)",
            "step": f"One recorded step, issued {times} time(s) identically"}[label]
    kept = "each wait where it was recorded" if n_waits else "no wait was seen"
    desc = (f"{what}: up to {n_calls} call(s) and {n_waits} wait(s) per rank on "
            f"{ranks_text(list(part))}, in recorded order ({kept}), at {sites_text(calls)}.")
    if unseen:
        desc += (f" {unseen} call(s) issued from C++ were waited there, not seen: waited "
                 "after the last step.")
    desc += f" Replayed at world size {world} only (a recorded program)."
    case: dict[str, Any] = {"name": name, "description": desc, "world_size": world}
    if tensors:
        case["tensors"] = tensors
    case["steps"] = steps
    if expected:
        case["expected"] = expected
    return case


def build_programs(rec: Recording) -> tuple[dict[str, Any], list[str]]:
    """The case document and its header notes, one program per recorded step."""
    used: set[str] = set()
    # only the part each trace kept in issue order: a program is that order (a call the
    # trace counted past it is not an event here; the header says the recording is partial)
    events = rank_events([replace(c, count=1) for c in rec.calls if c.ordered], rec.waits)
    parts = split(events)
    cases = [program_case(unique_name(["program", label], used), label, part,
                          rec.world_size, times) for label, part, times in parts]
    shown = ", ".join(f"{label} (x{t})" if t > 1 else label for label, _, t in parts)
    notes = [f"granularity program: one program per recorded step: {shown}"]
    if rec.world_sizes:
        notes.append(f"world sizes asked: {', '.join(map(str, rec.world_sizes))}; programs "
                     f"replay at the recorded world size {rec.world_size} only")
    notes += [f"not replayed: {line}" for line in rec.notes]
    return {"cases": cases}, notes
