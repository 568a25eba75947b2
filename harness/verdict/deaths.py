"""Every rank accounted in a program through a failure (:mod:`harness.casefile.deaths`).

Each planned death must have happened as planned: a rank that was to die and answered, or is
blocked instead, fails the instance, which names the step. A death nobody planned is a crash
(the pool says so before this runs). The record lists each death (rank, step, how, what was
observed), the survivors, and for each survivor the errors its steps expected, with how soon
each came: "detected after 0.012 s, bound 2 s".
"""

from __future__ import annotations

from typing import Any

from ..model import Instance, PoolRun


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
        elif st is not None and st.state == "died":
            entry["observed"] = (f"killed by {st.signal}" if st.signal
                                 else f"exit code {st.exitcode}")
        else:
            where = f" in step {st.step} ({st.step_desc})" if st is not None else ""
            entry["observed"] = f"blocked{where}"
            problems.append(f"  rank {rank} was to die at step {step} ({how}) but is "
                            f"blocked{where}")
        deaths.append(entry)
    dead = {r for r, _, _ in inst.deaths}
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
    """Seconds each survivor took to see an expected error (for the library's figures)."""
    return [float(e["after_s"]) for s in entry.get("survivors", []) for e in s["errors"]
            if e["raised"]]
