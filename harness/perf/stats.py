"""From every rank's raw timings to nccl-tests' numbers, in the parent.

Per timed block (repeat) the time of one iteration is the maximum over ranks: the collective
is as slow as its slowest member (nccl-tests' ``-a 3``; its default averages the ranks). The
reported ``time_us`` is the median over repeats, with the minimum, the maximum and the relative
spread ``(max - min) / median``. Bandwidths follow nccl-tests (``doc/PERFORMANCE.md``):
``algbw = size / time`` in GB/s (1e9 bytes per second), ``busbw = algbw * factor`` with the op
table's factor (``2(n-1)/n`` all_reduce, ``(n-1)/n`` gathers, reduce-scatters and all-to-all,
``1`` broadcast, reduce and point-to-point), ``n`` the size of the group the op runs on.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from .. import dtypes, ops
from ..model import Instance, RankResult

# Environment variables that change what a collective costs; recorded with the numbers.
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "CUDA_", "OMP_",
                "MKL_", "UCX_", "FI_")
ENV_NAMES = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR")


def sig(value: float, digits: int = 5) -> float:
    """``value`` rounded to ``digits`` significant digits (bandwidths span 1e-6 to 1e3 GB/s:
    a fixed number of decimals would round small ones to zero)."""
    return float(f"{value:.{digits}g}")


def bandwidth(nbytes: int, seconds: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for ``nbytes`` moved in ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"a time must be positive, got {seconds}")
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * factor


def group_size(inst: Instance) -> int:
    """Members of the group the instance's first op runs on."""
    for step in inst.steps:
        if step.kind == "op":
            group = dict(step.args).get("group")
            return len(group) if group else inst.world_size
    return inst.world_size


def main_op(inst: Instance) -> ops.Op:
    """The op whose bus factor applies (the program's first op)."""
    first = next((s.op for s in inst.steps if s.kind == "op" and s.op), inst.op)
    return ops.get(first)


def form(inst: Instance) -> str:
    """``in-place`` when the op reads and writes one buffer (all_reduce, broadcast, reduce,
    ``inplace: true``), ``out-of-place`` when it has separate input and output buffers."""
    for step in inst.steps:
        if step.kind == "op":
            if dict(step.args).get("inplace") is True:
                return "in-place"
            names = {t for _, t in step.bufs}
            return "in-place" if len(names) == 1 and len(step.bufs) == 1 and \
                ops.get(step.op or inst.op).roles[0].access == "inout" else "out-of-place"
    return "out-of-place"


def aggregate(inst: Instance, results: dict[int, RankResult]) -> dict[str, Any]:
    """The record's ``perf`` section from every rank's raw timings.

    Call only for a passed instance. When a rank did not time (a reason in ``not_timed``) or
    the ranks' data do not line up, the section says why instead of giving numbers.
    """
    raw = [results[r].perf for r in sorted(results)]
    reasons = sorted({p["not_timed"] for p in raw if "not_timed" in p})
    if reasons:
        return {"not_timed": "; ".join(reasons)}
    if len(raw) != inst.world_size or not all("times_s" in p for p in raw):
        return {"not_timed": "not every rank reported timings"}
    repeats = {len(p["times_s"]) for p in raw}
    iters = {p["iters"] for p in raw}
    if len(repeats) != 1 or len(iters) != 1:
        return {"not_timed": "the ranks' timings do not line up (repeats or iterations differ)"}
    per_repeat = [max(p["times_s"][i] for p in raw) for i in range(repeats.pop())]
    nbytes = max(int(p["bytes"]) for p in raw)
    if nbytes <= 0 or min(per_repeat) <= 0:
        return {"not_timed": "no bytes moved or a zero time (nothing to divide)"}
    op = main_op(inst)
    n = group_size(inst)
    factor = op.bus_factor(n)
    med = statistics.median(per_repeat)
    lo, hi = min(per_repeat), max(per_repeat)
    algbw, busbw = bandwidth(nbytes, med, factor)
    info = dtypes.DTYPES.get(inst.dtype)
    itemsize = info.bits // 8 if info is not None and info.bits >= 8 else 1
    names = list(dict.fromkeys(s.op for s in inst.steps if s.kind == "op" and s.op))
    return {
        "op": "+".join(names) or op.name,  # a send/recv program reads isend+irecv
        "form": form(inst),
        "bytes": nbytes,
        "count": nbytes // itemsize,
        "group_size": n,
        "bus_factor": round(factor, 6),
        "warmup": int(raw[0]["warmup"]),
        "iters": iters.pop(),
        "repeats": len(per_repeat),
        "time_us": sig(med * 1e6),
        "time_us_min": sig(lo * 1e6),
        "time_us_max": sig(hi * 1e6),
        "spread": sig((hi - lo) / med),
        "algbw_gbs": sig(algbw),
        "busbw_gbs": sig(busbw),
        # busbw at the slowest and fastest repeat: the range the gate treats as noise.
        "busbw_gbs_min": sig(bandwidth(nbytes, hi, factor)[1]),
        "busbw_gbs_max": sig(bandwidth(nbytes, lo, factor)[1]),
        "repeat_times_us": [sig(t * 1e6) for t in per_repeat],
    }


def environment() -> dict[str, str]:
    """The environment variables that matter for collective performance, as set now."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def cpu_facts() -> dict[str, Any]:
    """CPU model and count (what the numbers of a CPU backend depend on)."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh
                          if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu_model": model, "cpu_count": os.cpu_count() or 0,
            "cpus_usable": len(os.sched_getaffinity(0))}


def point(record: dict[str, Any]) -> dict[str, Any]:
    """One row of the report's top-level ``perf.points``: identity plus the numbers."""
    p = record["perf"]
    return {"key": record["key"], "case": f"{record['file']}::{record['case']}",
            "backend": record["backend"], "device": record["device"],
            "world_size": record["world_size"], "dtype": record["dtype"],
            "reduce_op": record["reduce_op"], "root": _root(record),
            **{k: p[k] for k in ("op", "form", "bytes", "count", "time_us",
                                  "spread", "algbw_gbs", "busbw_gbs", "busbw_gbs_min",
                                  "busbw_gbs_max")}}


def _root(record: dict[str, Any]) -> int | None:
    axes = record.get("axes", {})
    for k in ("src", "dst"):
        if isinstance(axes.get(k), int):
            return int(axes[k])
    return None


def section(records: list[dict[str, Any]], metadata: dict[str, Any]) -> dict[str, Any] | None:
    """The report's top-level ``perf`` section, or None when nothing was timed or asked."""
    settings = (metadata.get("options") or {}).get("perf")
    timed = [r for r in records if "time_us" in r.get("perf", {})]
    if settings is None and not timed:
        return None
    return {"settings": settings or {}, "environment": environment(),
            "host": cpu_facts(),
            "points": [point(r) for r in sorted(timed, key=lambda r: r["key"])],
            "not_timed": sum("not_timed" in r.get("perf", {}) for r in records)}
