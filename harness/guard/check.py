"""Deciding a sampled call from every rank's digests (plain data; no torch).

A call's ``spec`` (the same on every rank) says what was digested: ``kind`` (``reduce``,
``broadcast``, ``gather``, ``reduce_scatter``, ``p2p``), the group's global ranks, the root's
position, the reduce op, the dtype's unit roundoff ``u`` and smallest normal ``tiny`` (floats),
its width in bits (integers), the chunk length and words per element. Each rank's ``digests``
holds ``in`` and ``out`` lists of per-chunk rows from :mod:`harness.guard.digest`.

The bound for a SUM (or AVG) reduction's linear checksum is the numerics work's
(:func:`harness.program.fp64.summation_bound`): any order of the ``k = W - 1`` additions of an
element's ``W`` contributions lies within ``gamma_k * sum_i |x_i|`` of the exact sum, plus the
rounding to the dtype (2 ulp there, at most ``4u|out|`` here). Weighted by ``w_j >= 1`` and
summed over a chunk this gives ``gamma_k * sum_i A_i + 4u A_out`` (``A``: the weighted sums of
absolute values each rank sent), plus the float64 error of forming the checksums themselves
(``gamma_{L+W}`` in float64 over the same magnitudes) and subnormal slack. A difference beyond
it is no rounding any order could give; within it is passed, so a wrong value smaller than the
rounding of the whole chunk is not caught by this check (the rank-agreement check may still
catch it). Integer SUM checksums are exact, compared modulo 2^bits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MASK64 = (1 << 64) - 1
U64 = 2.0**-53


@dataclass
class Mismatch:
    """One rank's chunk that disagrees: ``rank`` received it wrong (from ``sender``)."""

    rank: int
    chunk: int
    what: str
    sender: int | None = None
    first: int | None = None  # first differing element of the tensor, where computable
    tensor: int = 0  # which of the call's tensors (blocks count as tensors)


@dataclass
class Verdict:
    """What a call's check found: mismatches, and chunks no check could judge."""

    mismatches: list[Mismatch] = field(default_factory=list)
    unchecked: int = 0


def _signed(x: int) -> int:
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


def locate(got: list[int], want: list[int], spec: dict[str, Any], chunk: int) -> int | None:
    """The first differing element of a chunk whose exact digests (plain word sum, position-
    weighted sum, ...) differ, when exactly one word changed (the ratio of the two differences
    is its position); None otherwise."""
    d0 = _signed(got[0] - want[0])
    d1 = _signed(got[1] - want[1])
    if d0 == 0 or d1 % d0:
        return None
    pos = d1 // d0
    per = int(spec.get("per", 1))
    n = int(spec["chunk"])
    if not 1 <= pos <= n * per:
        return None
    return chunk * n + (pos - 1) // per


def _gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u) if k * u < 1 else math.inf


def sum_bound(spec: dict[str, Any], a_in: float, a_out: float) -> float:
    """How far a float SUM/AVG output checksum may be from the inputs' (see the module doc)."""
    c_in, c_out, slack = _terms(len(spec["group"]), float(spec["u"]), float(spec["tiny"]),
                                int(spec["chunk"]), spec.get("reduce") == "avg")
    return c_in * a_in + c_out * a_out + slack


@functools.lru_cache(maxsize=256)
def _terms(w: int, u: float, tiny: float, n: int, avg: bool) -> tuple[float, float, float]:
    """The bound's factors of the inputs' and the output's magnitudes, and its constant."""
    f64 = _gamma(n + w + 2, U64)
    contrib = _gamma(max(w - 1, 1), u) / (w if avg else 1)
    own = (6 if avg else 4) * u
    return contrib + f64, own + f64, 4 * n * tiny * 16 * w


def _reduce_chunk(spec: dict[str, Any], ins: list[list[Any]], out: list[Any]) -> str | None:
    """Whether one chunk's output checksum agrees with its inputs' (None) or how it does not."""
    op = spec.get("reduce", "sum")
    if "bits" in spec:  # integers: exact, modulo the dtype's width
        if op != "sum":
            return None
        mod = (1 << int(spec["bits"])) - 1
        if (int(out[0]) - sum(int(i[0]) for i in ins)) & mod:
            return "the output's integer checksum is not the sum of the ranks' inputs'"
        return None
    vals = [float(i[0]) for i in ins] + [float(out[0])]
    mags = [float(i[1]) for i in ins] + [float(out[1])]
    if not math.isfinite(sum(mags)) and not all(math.isfinite(v) for v in vals + mags):
        return ""  # inf/NaN in the data: no linear check (counted as unchecked)
    if op in ("sum", "avg"):
        want = math.fsum(vals[:-1]) / (len(ins) if op == "avg" else 1)
        diff = abs(vals[-1] - want)
        bound = sum_bound(spec, math.fsum(mags[:-1]), mags[-1])
        if diff > bound:
            return (f"output checksum {vals[-1]:.17g} is {diff:.3g} from the inputs' "
                    f"{want:.17g}, beyond the rounding bound {bound:.3g}")
        return None
    if op in ("max", "min"):
        # elementwise out >= every input (max) with positive weights: the checksums keep it
        slack = _gamma(int(spec["chunk"]) + 2, U64) * (max(mags) + mags[-1])
        for r, v in enumerate(vals[:-1]):
            if (op == "max" and vals[-1] < v - slack) or (op == "min" and vals[-1] > v + slack):
                return (f"output checksum {vals[-1]:.17g} is {'below' if op == 'max' else 'above'}"
                        f" rank position {r}'s input {v:.17g}: not its {op}")
    return None


def _agreement(spec: dict[str, Any], digs: list[dict[str, Any]], idx: int,
               ranking: Callable[[], dict[int, float]]) -> list[Mismatch]:
    """Every rank must hold the same bits after an all_reduce (each element is computed once
    and delivered, in NCCL and Gloo alike); a rank in the minority (or, in a tie, the one whose
    checksum is further from the inputs') is named."""
    group = spec["group"]
    out: list[Mismatch] = []
    n = len(digs[0]["out"][idx])
    for c in range(n):
        votes: dict[tuple[int, ...], list[int]] = {}
        for pos, d in enumerate(digs):
            votes.setdefault(tuple(d["out"][idx][c]), []).append(pos)
        if len(votes) < 2:
            continue
        ranked = ranking()
        ranked_votes = sorted(votes.items(), key=lambda kv: (-len(kv[1]), min(
            ranked.get(p, 0.0) for p in kv[1])))
        majority = ranked_votes[0]
        tie = len(ranked_votes[1][1]) == len(majority[1])
        for key, positions in ranked_votes[1:]:
            for p in positions:
                why = (" (a tie: named as the one further from the inputs' checksum, but "
                       "either may be wrong)" if tie else " (ranks must agree bit for bit)")
                out.append(Mismatch(group[p], c, "its result differs from rank "
                                    f"{group[majority[1][0]]}'s{why}",
                                    None, locate(list(key), list(majority[0]), spec, c)))
    return out


def _residual(spec: dict[str, Any], digs: list[dict[str, Any]], pos: int) -> float:
    ins = [d["in"][0] for d in digs]
    total = 0.0
    for c, row in enumerate(digs[pos]["out"][0]):
        want = math.fsum(float(i[c][0]) for i in ins)
        if spec.get("reduce") == "avg":
            want /= len(ins)
        got = float(row[0])
        if math.isfinite(got) and math.isfinite(want):
            total += abs(got - want)
    return total


def check_reduce(spec: dict[str, Any], digs: list[dict[str, Any]]) -> Verdict:
    """all_reduce: every rank's output checksum against the sum of the inputs', per chunk;
    then the ranks' exact digests must agree."""
    v = Verdict()
    group = spec["group"]
    linear = spec.get("linear") != "no"
    # Ranks that hold the same output checksum get the same answer: each distinct row is
    # judged once (on an honest call, once per chunk whatever the group's size).
    judged: dict[tuple[int, Any, Any], str | None] = {}
    for pos, d in enumerate(digs if linear else []):
        for c, row in enumerate(d["out"][0]):
            key = (c, row[0], row[1])
            if key not in judged:
                judged[key] = _reduce_chunk(spec, [e["in"][0][c] for e in digs], row)
            why = judged[key]
            if why == "":
                v.unchecked += 1
            elif why:
                v.mismatches.append(Mismatch(group[pos], c, why))

    def ranking() -> dict[int, float]:  # asked only where the ranks disagree
        if not linear or "bits" in spec:
            return {}
        return {p: _residual(spec, digs, p) for p in range(len(digs))}

    seen = {(m.rank, m.chunk) for m in v.mismatches}
    v.mismatches += [m for m in _agreement(spec, digs, -1, ranking)
                     if (m.rank, m.chunk) not in seen]
    return v


def check_reduce_scatter(spec: dict[str, Any], digs: list[dict[str, Any]]) -> Verdict:
    """reduce_scatter: rank p's output checksum against the sum of every rank's block p."""
    v = Verdict()
    group = spec["group"]
    for pos, d in enumerate(digs):
        for c, row in enumerate(d["out"][0]):
            why = _reduce_chunk(spec, [e["in"][pos][c] for e in digs], row)
            if why == "":
                v.unchecked += 1
            elif why:
                v.mismatches.append(Mismatch(group[pos], c, why, tensor=pos))
    return v


def _same(got: list[Any], want: list[Any], spec: dict[str, Any], rank: int, sender: int | None,
          what: str, tensor: int) -> list[Mismatch]:
    out = []
    for c, (g, w) in enumerate(zip(got, want, strict=False)):
        if list(g) != list(w):
            out.append(Mismatch(rank, c, what, sender, locate(list(g), list(w), spec, c), tensor))
    if len(got) != len(want):
        out.append(Mismatch(rank, min(len(got), len(want)), f"{what} (chunk counts differ: "
                            f"{len(got)} received, {len(want)} sent)", sender, None, tensor))
    return out


def check_broadcast(spec: dict[str, Any], digs: list[dict[str, Any]]) -> Verdict:
    """broadcast: every rank's buffer must hold the root's bytes, chunk for chunk."""
    v = Verdict()
    group, root = spec["group"], int(spec["root"])
    for pos, d in enumerate(digs):
        if pos == root:
            continue
        for t, (got, want) in enumerate(zip(d["out"], digs[root]["out"], strict=False)):
            v.mismatches += _same(got, want, spec, group[pos], group[root],
                                  "received bytes differ from what the root sent", t)
    return v


def check_gather(spec: dict[str, Any], digs: list[dict[str, Any]]) -> Verdict:
    """all_gather: rank p's block i must hold rank i's input, chunk for chunk."""
    v = Verdict()
    group = spec["group"]
    for pos, d in enumerate(digs):
        for i, got in enumerate(d["out"]):
            v.mismatches += _same(got, digs[i]["in"][0], spec, group[pos], group[i],
                                  f"block {i} differs from what rank {group[i]} sent", i)
    return v


def check_p2p(spec: dict[str, Any], sent: dict[str, Any], got: dict[str, Any]) -> Verdict:
    """send/recv: what the receiver holds must be what the sender sent, chunk for chunk."""
    return Verdict(_same(got["out"][0], sent["in"][0], spec, int(got["rank"]),
                         int(sent["rank"]), "received bytes differ from what was sent", 0))


SumOk = Callable[[list[bytes], list[bytes], float, float, float, bool], bool]


def honest(spec: dict[str, Any], digs: list[dict[str, Any]], sum_ok: SumOk | None) -> bool:
    """Whether the call is certainly clean, judged on its raw digests (kind, columns, bytes:
    :mod:`harness.guard.channel`) without reading a number in Python: every digest that must
    equal another does, byte for byte, and a float SUM/AVG reduction's linear digests pass
    ``sum_ok`` (the C++ kernel's test: within half of :func:`sum_bound`, see guard.cpp). False
    means only "not decided here": :func:`decide` (or :func:`check_p2p`) then judges the call,
    so a finding is always theirs. The digests ``digs`` are in group order (p2p: sender,
    receiver)."""
    kind = spec["kind"]
    if kind == "p2p":
        sent, got = digs[0]["in"], digs[1]["out"]
        return bool(sent) and bool(got) and got[0] == sent[0]
    if kind == "broadcast":
        root = digs[int(spec["root"])]["out"]
        return all(d["out"] == root for d in digs)
    if kind == "gather":
        sent = [d["in"][0] if d["in"] else None for d in digs]
        return all(d["out"] == sent for d in digs)
    if (kind != "reduce" or sum_ok is None or "u" not in spec or "bits" in spec
            or spec.get("linear") == "no" or spec.get("reduce", "sum") not in ("sum", "avg")):
        return False
    outs = [d["out"] for d in digs]
    ins = [d["in"][0] if len(d["in"]) == 1 else None for d in digs]
    if any(len(o) != 2 or o[1] != outs[0][1] for o in outs):
        return False  # (the exact digests: the ranks must hold the same bits)
    if any(x is None or x[:2] != ("d", 2) for x in ins + [o[0] for o in outs]):
        return False
    c_in, c_out, slack = _terms(len(spec["group"]), float(spec["u"]), float(spec["tiny"]),
                                int(spec["chunk"]), spec.get("reduce") == "avg")
    return sum_ok([x[2] for x in ins if x is not None], [o[0][2] for o in outs], c_in, c_out,
                  slack, spec.get("reduce") == "avg")


CHECKS = {"reduce": check_reduce, "reduce_scatter": check_reduce_scatter,
          "broadcast": check_broadcast, "gather": check_gather}


def decide(spec: dict[str, Any], digs: list[dict[str, Any]]) -> Verdict:
    """The verdict on one collective call from its ranks' digests, in group order."""
    return CHECKS[spec["kind"]](spec, digs)
