"""Every rank accounted in a program through a failure (:mod:`harness.casefile.deaths`).

Each planned death must have happened as planned: a rank that was to die and answered, or is
blocked instead, fails the instance, which names the step. A death nobody planned (a rank
killed from outside, a backend that crashed it, a planned death that came at another step) is
a crash: it is listed too, with ``by_design: false`` and the step the rank was in, and the rank
is no survivor. The record lists each death (rank, step, how, what was observed), the
survivors, and for each survivor the errors its steps expected, with how soon each came:
"detected after 0.012 s, bound 2 s". Over a session, :func:`detection_line` gives the median
and the maximum of those times, from the records alone (the reports' summary line).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from ..model import Instance, PoolRun, RankState

UNDECLARED = "undeclared"  # the ``how`` of a death no step planned


def _where(st: RankState) -> str:
    if st.step >= 0:
        return f" in step {st.step} ({st.step_desc})"
    return f" while {st.step_desc}" if st.step_desc else ""


def _killed(st: RankState) -> str:
    return f"killed by {st.signal}" if st.signal else f"exit code {st.exitcode}"


def account(inst: Instance, run: PoolRun) -> tuple[list[str], dict[str, Any]]:
    """(one line per planned death that did not happen as planned, the record's entry)."""
    states = {s.rank: s for s in run.states}
    problems: list[str] = []
    deaths: list[dict[str, Any]] = []
    for rank, step, how in inst.deaths:
        st = states.get(rank)
        entry: dict[str, Any] = {"rank": rank, "step": step, "how": how, "by_design": True}
        if rank in run.results:
            did = "raised" if run.results[rank].status == "raised" else "finished"
            entry["observed"] = did
            problems.append(f"  rank {rank} was to die at step {step} ({how}) but {did}")
        elif how == "stall":
            entry["observed"] = "stalled" if st is not None and st.state == "blocked" else (
                st.state if st is not None else "unknown")
            if entry["observed"] != "stalled":
                problems.append(f"  rank {rank} was to stall at step {step} but "
                                f"{entry['observed']}")
        elif st is not None and st.state == "died" and st.step != step:
            # Dead before its fault step: not this death but one nobody planned, listed with
            # the undeclared ones below.
            problems.append(f"  rank {rank} was to die at step {step} ({how}) but died "
                            f"first{_where(st)} ({_killed(st)})")
            continue
        elif st is not None and st.state == "died":
            entry["observed"] = _killed(st)
        elif run.kind == "crash":  # cut short by a death nobody planned: not reached
            entry["observed"] = f"not reached{_where(st) if st is not None else ''}"
        else:
            where = _where(st) if st is not None else ""
            entry["observed"] = f"blocked{where}"
            problems.append(f"  rank {rank} was to die at step {step} ({how}) but is "
                            f"blocked{where}")
        deaths.append(entry)
    listed = {d["rank"] for d in deaths}
    deaths += [{"rank": st.rank, "step": st.step, "how": UNDECLARED, "by_design": False,
                "observed": f"{_killed(st)}{_where(st)}"}
               for st in run.states if st.state == "died" and st.rank not in listed]
    dead = {r for r, _, _ in inst.deaths} | {d["rank"] for d in deaths}
    survivors = []
    for rank in range(inst.world_size):
        if rank in dead:
            continue
        res = run.results.get(rank)
        seen = [{"step": int(o["step"]), "after_s": o["after_s"],
                 **({"within_s": inst.steps[int(o["step"])].raises_within}
                    if inst.steps[int(o["step"])].raises_within is not None else {}),
                 "raised": f"{o['type']}: {str(o['message'])[:160]}" if o["raised"] else ""}
                for o in (res.step_errors if res is not None else [])]
        survivors.append({"rank": rank, "answered": res is not None, "errors": seen})
    return problems, {"deaths": deaths, "survivors": survivors}


def detection_times(entry: dict[str, Any]) -> list[float]:
    """Seconds each survivor took to see an expected error, from a record (or the entry
    :func:`account` returns); anything not shaped as this module writes it is left out (a
    report read back from a file)."""
    survivors = entry.get("survivors")
    out: list[float] = []
    for s in survivors if isinstance(survivors, list) else []:
        errors = s.get("errors") if isinstance(s, dict) else None
        for e in errors if isinstance(errors, list) else []:
            after = e.get("after_s") if isinstance(e, dict) else None
            if (e.get("raised") if isinstance(e, dict) else None) and isinstance(
                    after, int | float) and not isinstance(after, bool) and math.isfinite(after):
                out.append(float(after))
    return out


def detection_line(records: Iterable[Any]) -> str:
    """``peer deaths detected after median 0.021 s, max 0.335 s (26 detections in 16
    instances)`` over the records of programs through a failure; "" when none detected any."""
    times: list[float] = []
    instances = 0
    for rec in records:
        if isinstance(rec, dict) and "survivors" in rec:
            seen = detection_times(rec)
            instances += bool(seen)
            times += seen
    if not times:
        return ""
    return (f"peer deaths detected after median {statistics.median(times):.3g} s, max "
            f"{max(times):.3g} s ({len(times)} detection{'s' if len(times) != 1 else ''} in "
            f"{instances} instance{'s' if instances != 1 else ''} through a failure)")
