"""The report's bandwidth section (``--perf``) as Markdown, in nccl-tests' column order.

One table per backend, device, op and world size, rows by dtype and size, the out-of-place
and in-place forms side by side as nccl-tests prints them:
``size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong``. Only
instances whose correctness check passed are timed, so ``#wrong`` is 0 wherever there are
numbers; a form the op does not have (torch's all_reduce, broadcast and reduce work in place
only) shows ``-``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

FORMS = ("out-of-place", "in-place")
HEADER = ("| size (B) | count | type | redop | root "
          "| out-of-place time (us) | algbw (GB/s) | busbw (GB/s) | #wrong "
          "| in-place time (us) | algbw (GB/s) | busbw (GB/s) | #wrong | spread |")


def num(value: float) -> str:
    """A number as nccl-tests prints it: fixed decimals for the usual ranges."""
    if value >= 100:
        return f"{value:.1f}"
    if value >= 0.01:
        return f"{value:.2f}"
    return f"{value:.2g}"


def facts(report: dict[str, Any]) -> list[str]:
    """What makes the numbers comparable: versions, devices, settings, host, environment."""
    meta, perf = report["metadata"], report["perf"]
    s = perf.get("settings") or {}
    host = perf.get("host") or {}
    lines = [
        f"- torch {meta.get('torch', '?')}, Python {meta.get('python', '?')}, backends "
        f"{', '.join(meta.get('backends') or []) or '-'}"
        + (f", NCCL {meta['nccl_version']}" if meta.get("nccl_version") else ""),
        f"- devices: {', '.join(meta.get('devices') or []) or '-'}"
        + (f"; GPUs: {', '.join(meta.get('cuda_device_names') or [])}"
           if meta.get("cuda_devices") else "")
        + f"; host {meta.get('hostname', '?')}: {host.get('cpu_model') or 'CPU ?'}, "
          f"{host.get('cpus_usable', '?')} of {host.get('cpu_count', '?')} CPUs usable",
        f"- world sizes: {', '.join(map(str, meta.get('world_sizes') or []))}",
    ]
    if s:
        lines.append(
            f"- loop: {s.get('warmup')} warm-up iterations, then {s.get('repeats')} timed "
            f"blocks of at least {s.get('iters')} iterations and {s.get('min_time_s')} s each "
            "(the same count on every rank); time per iteration = the slowest rank's, median "
            "over blocks; spread = (max - min) / median over blocks; GB/s = 1e9 bytes/s")
    env = perf.get("environment") or {}
    lines.append("- environment: " + (", ".join(f"`{k}={v}`" for k, v in env.items())
                                       if env else "no NCCL_/GLOO_/TORCH_NCCL_/OMP_/CUDA_ "
                                       "variables set"))
    return lines


def tables(points: list[dict[str, Any]]) -> list[str]:
    """One nccl-tests-style table per (backend, device, op, world size)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        groups[(p["backend"], p["device"], p["op"], p["world_size"])].append(p)
    out: list[str] = []
    for (backend, device, op, ws), pts in sorted(groups.items()):
        rows: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
        for p in sorted(pts, key=lambda p: (p["dtype"], p["bytes"], p["key"])):
            base = (p["dtype"], p["bytes"], p["reduce_op"] or "", p["root"])
            n = 0
            while p["form"] in rows.get((*base, n), {}):
                n += 1  # two instances of one size and form: one row each
            rows.setdefault((*base, n), {})[p["form"]] = p
        out += [f"### {op} · {backend} on {device} · world size {ws}", "",
                HEADER, "|" + "---|" * 14]
        for (dtype, nbytes, redop, root, _), forms in rows.items():
            first = next(iter(forms.values()))
            cells = [str(nbytes), str(first["count"]), dtype, redop or "none",
                     "-" if root is None else str(root)]
            spreads = []
            for form in FORMS:
                got = forms.get(form)
                if got is None:
                    cells += ["-"] * 4
                    continue
                cells += [num(got["time_us"]), num(got["algbw_gbs"]), num(got["busbw_gbs"]),
                          "0"]
                spreads.append(f"{got['spread'] * 100:.0f}%")
            out.append("| " + " | ".join([*cells, " / ".join(spreads)]) + " |")
        avg = statistics.mean(p["busbw_gbs"] for p in pts)
        out += ["", f"Avg bus bandwidth: {num(avg)} GB/s (mean busbw of the {len(pts)} "
                "points above)", ""]
    return out


def render(report: dict[str, Any]) -> str:
    """The bandwidth section ("" when the report has no perf section)."""
    perf = report.get("perf")
    if not perf:
        return ""
    out = ["", "## Bandwidth (perf mode)", ""]
    out += facts(report)
    out.append("")
    if perf["not_timed"]:
        out += [f"{perf['not_timed']} passed instance(s) were not timed (the record's "
                "`perf.not_timed` says why: programs with sleeps or ordering steps, object "
                "collectives, expected rejections).", ""]
    if not perf["points"]:
        out += ["No instance was timed.", ""]
    out += tables(perf["points"])
    return "\n".join(out)
