"""Verdicts of the async-contract checks (parent side; no torch).

The seeds' contract for an async collective, checked per instance (parent side; no torch):

- ``pre_op``: the data written just before the call (by slow work: a sleep kernel on the
  current CUDA stream, or a delayed host write on CPU) is the data communicated;
- ``post_wait``: work issued right after ``wait()`` (a copy on the current CUDA stream, a host
  read on CPU) sees the final result, without a host synchronize, while a peer is delayed;
- ``completion``: ``is_completed()`` is true after ``wait()`` (CPU) or after ``wait()`` and a
  device synchronize (CUDA), and whenever it says true the result is in place (probes for
  shorthand collectives; for point-to-point ops of programs, the receive buffers when the
  call returned with ``is_completed()`` True must already hold what ``wait()`` leaves);
- ``host_blocking``: a blocking call, with a peer delayed, returns with the result visible to
  the next read; whether it held the host until the collective finished is recorded as an
  observed property of the backend (``blocks`` / ``returns_early``);
- ``declared``: the expectations a case states on ``read``/``future`` snapshots.

The first four come from *probes*: extra runs of a shorthand async instance with delays
injected (see :mod:`harness.ordering.probes`). They cost a few tens of milliseconds each, so by
default they run on a representative sample: per case, the first async instance of each
world size and device (the other axes at their first value). ``ordering: all`` on a case or
``--ordering all`` runs them on every async instance; ``none`` on none. ``completion`` from the
instance's own timeline and ``declared`` are checked on every instance.

An override's ``ordering: [check, ...]`` documents a known divergence: the verdict stays
``violated`` in the report, with the override's reason, but does not fail the instance.
"""

from __future__ import annotations

import math
from typing import Any

from ..model import Instance, InstanceResult, OrderingPlan, RankResult

CHECKS = ("pre_op", "post_wait", "completion", "host_blocking", "declared")
STATUSES = ("ok", "violated", "inconclusive", "n/a")
BLOCKING_FRACTION = 0.5  # a blocking call shorter than this share of the delay returned early
MAX_DETAIL_LINES = 6


def _verdict(status: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"status": status, "detail": detail, **extra}


def _lines(items: list[str]) -> str:
    if len(items) > MAX_DETAIL_LINES:
        items = [*items[:MAX_DETAIL_LINES], f"... and {len(items) - MAX_DETAIL_LINES} more"]
    return "; ".join(items)


def _probe(results: dict[int, RankResult], name: str) -> dict[int, dict[str, Any]]:
    return {r: res.ordering["probes"][name] for r, res in sorted(results.items())
            if name in res.ordering.get("probes", {})}


def _baseline(results: dict[int, RankResult]) -> tuple[bool, str]:
    """Whether the op gives right values when nothing is delayed at the call (settled read)."""
    bad = [f"rank {r}: {o['settled_wrong']}" for r, o in _probe(results, "post_wait").items()
           if not o["settled_ok"]]
    return (not bad, _lines(bad))


def _pre_op(plan: OrderingPlan, results: dict[int, RankResult], base: tuple[bool, str]
            ) -> dict[str, Any]:
    obs = _probe(results, "pre_op")
    if not plan.probes or not obs:
        return _verdict("n/a", _why_no_probe(plan))
    if not base[0]:
        return _verdict("inconclusive", f"values are wrong even without delays: {base[1]}")
    bad = [f"rank {r}: {o['wrong']}" for r, o in obs.items() if not o["ok"]]
    if bad:
        return _verdict("violated", "the input was written by slow work just before the call "
                        "but the collective did not communicate it: " + _lines(bad))
    return _verdict("ok", f"input written after a {plan.delay_s:g} s delay was communicated")


def _post_wait(plan: OrderingPlan, results: dict[int, RankResult], base: tuple[bool, str]
               ) -> dict[str, Any]:
    obs = _probe(results, "post_wait")
    if not plan.probes or not obs:
        return _verdict("n/a", _why_no_probe(plan))
    if not base[0]:
        return _verdict("inconclusive", f"values are wrong even after settling: {base[1]}")
    bad = [f"rank {r}: {o['immediate_wrong']}" for r, o in obs.items() if not o["immediate_ok"]]
    if bad:
        return _verdict("violated", f"with rank {plan.delayed_rank} delayed {plan.delay_s:g} s, "
                        "a read issued right after wait() saw a result not yet in place: "
                        + _lines(bad))
    return _verdict("ok", f"reads right after wait() saw the result (rank {plan.delayed_rank} "
                    f"delayed {plan.delay_s:g} s)")


def _completion(inst: Instance, plan: OrderingPlan, results: dict[int, RankResult],
                base: tuple[bool, str]) -> dict[str, Any]:
    cuda = inst.device == "cuda"
    after = "after wait() and a device synchronize" if cuda else "after wait()"
    bad: list[str] = []
    seen = 0  # is_completed() values actually observed: "ok" needs at least one
    for r, res in sorted(results.items()):
        for ev in res.events:
            flag = ev.completed_after_sync if cuda else ev.completed_after_wait
            seen += flag is not None
            if flag is False:
                bad.append(f"rank {r}: step {ev.index} {ev.what}: is_completed() is False "
                           f"{after}")
            if ev.completed_at_return and ev.at_return_in_place is False:
                bad.append(f"rank {r}: step {ev.index} {ev.what}: is_completed() was True "
                           "when the call returned but the received data was not in place "
                           "yet (the buffer changed before wait() returned)")
    for r, o in _probe(results, "post_wait").items():
        flag = o["completed_after_sync"] if cuda else o["completed_after_wait"]
        seen += flag is not None
        if flag is False:
            bad.append(f"rank {r}: probe: is_completed() is False {after}")
        if o["completed_at_return"] and not o["at_return_ok"] and base[0]:
            bad.append(f"rank {r}: is_completed() was True when the call returned (rank "
                       f"{plan.delayed_rank} delayed) but the result was not in place: "
                       f"{o['at_return_wrong']}")
    if bad:
        return _verdict("violated", _lines(bad))
    if not plan.async_steps:
        return _verdict("n/a", "no async op")
    if not seen:
        return _verdict("n/a", "no is_completed() value was observed (the async calls "
                        "returned no Work with is_completed(), e.g. a Future)")
    return _verdict("ok", f"is_completed() true {after}"
                    + ("; true at return only with the result in place"
                       if plan.probes and not moves_nothing(inst) else ""))


def _host_blocking(plan: OrderingPlan, results: dict[int, RankResult], base: tuple[bool, str]
                   ) -> dict[str, Any]:
    obs = _probe(results, "host_blocking")
    if not plan.probes or not obs:
        return _verdict("n/a", _why_no_probe(plan), observed="unknown")
    times = {r: o["return_s"] for r, o in obs.items() if o["observer"]}
    limit = BLOCKING_FRACTION * plan.delay_s
    if not times:
        observed = "unknown"
    elif all(t >= limit for t in times.values()):
        observed = "blocks"
    elif all(t < limit for t in times.values()):
        observed = "returns_early"
    else:
        observed = "mixed"
    measured = ", ".join(f"rank {r} {t * 1000:.1f} ms" for r, t in times.items())
    facts = {"observed": observed, "return_s": {str(r): round(t, 6) for r, t in times.items()}}
    if not base[0]:
        return _verdict("inconclusive", "values are wrong even without delays", **facts)
    bad = [f"rank {r}: {o['immediate_wrong']}" for r, o in obs.items() if not o["immediate_ok"]]
    if bad:
        return _verdict("violated", "a read issued right after the blocking call returned saw "
                        "a result not yet in place: " + _lines(bad), **facts)
    what = {"blocks": "held the host until the collective finished",
            "returns_early": "returned before the collective finished",
            "mixed": "held the host on some ranks only",
            "unknown": "(no rank waited on the delayed one)"}[observed]
    return _verdict("ok", f"blocking call {what} (rank {plan.delayed_rank} delayed "
                    f"{plan.delay_s:g} s{'; ' + measured if measured else ''}); the next read "
                    "saw the result", **facts)


def _declared(plan: OrderingPlan, results: dict[int, RankResult]) -> dict[str, Any]:
    if not plan.declared:
        return _verdict("n/a", "no read/future expectations in the case")
    bad: list[str] = []
    count = 0
    for r, res in sorted(results.items()):
        for rd in res.ordering.get("reads", []):
            if rd.get("expect") is None:
                continue
            count += 1
            if not rd["ok"]:
                bad.append(f"rank {r}: {rd['name']} (step {rd['step']}, expect {rd['expect']}): "
                           f"{rd['wrong_text']}")
        for fu in res.ordering.get("futures", []):
            if not fu["callback_ran"]:
                bad.append(f"rank {r}: the get_future() callback of {fu['handle']} never ran")
    if bad:
        return _verdict("violated", _lines(bad))
    return _verdict("ok", f"{count} snapshot expectation(s) met")


def _failed_read_line(inst: Instance, results: dict[int, RankResult]) -> int | None:
    """The YAML line of the first read step whose expectation failed on some rank."""
    steps: list[int] = sorted(int(rd["step"]) for res in results.values()
                   for rd in res.ordering.get("reads", [])
                   if rd.get("expect") is not None and not rd["ok"])
    if steps and 0 <= steps[0] < len(inst.steps):
        return inst.steps[steps[0]].line
    return None


def _why_no_probe(plan: OrderingPlan) -> str:
    if not plan.shorthand_async:
        return "probes run on async instances of the op: form"
    if plan.probes:
        return "the probe did not run on this rank"
    return ("probes run on a sample: see this case's other instances" if plan.mode == "sample"
            else "probes are turned off (ordering: none)")


def moves_nothing(inst: Instance) -> bool:
    """Whether the op's buffers hold zero elements on every rank. Such an op has nothing to
    communicate, so probes of when data moved observe nothing: a label would be unsupported."""
    if inst.shorthand is None:
        return False
    names = set(inst.shorthand)
    specs = [t for t in inst.tensors if t.name in names]
    for t in specs:
        for r in range(inst.world_size):
            shape = t.shape_for(r)
            if shape is None or not all(isinstance(d, int) for d in shape):
                return False
            if math.prod(d for d in shape if isinstance(d, int)) != 0:
                return False
    return bool(specs)


NOTHING_TO_MOVE = ("nothing to move: the op's buffers have zero elements, so there is no data "
                   "whose timing could be observed")


def judge(inst: Instance, results: dict[int, RankResult]) -> dict[str, Any]:
    """The ordering verdicts of one instance, as stored in its report record.

    A verdict or observed label is written only when the observation supports it: with zero
    elements to move, pre-op, post-wait and host blocking are ``n/a`` with that reason."""
    plan = inst.ordering
    assert plan is not None
    base = _baseline(results)
    verdicts: dict[str, Any] = {
        "pre_op": _pre_op(plan, results, base),
        "post_wait": _post_wait(plan, results, base),
        "completion": _completion(inst, plan, results, base),
        "host_blocking": _host_blocking(plan, results, base),
        "declared": _declared(plan, results),
    }
    if plan.probes and moves_nothing(inst):
        for check in ("pre_op", "post_wait", "host_blocking"):
            verdicts[check] = _verdict("n/a", NOTHING_TO_MOVE)
    verdicts["probes"] = plan.probes
    verdicts["delay_s"] = plan.delay_s
    verdicts["delayed_rank"] = plan.delayed_rank if plan.probes else None
    return verdicts


def apply(inst: Instance, results: dict[int, RankResult], res: InstanceResult,
          completed: bool) -> None:
    """Store the verdicts on ``res``; a violation fails an instance whose values passed."""
    if inst.ordering is None or not completed or inst.expectation.kind != "pass":
        return
    res.ordering = judge(inst, results)
    known = dict(inst.ordering.known)
    for check, reason in known.items():
        if res.ordering[check]["status"] == "violated":
            res.ordering[check]["known"] = reason  # documented by an override: reported only
    violated = [c for c in CHECKS if res.ordering[c]["status"] == "violated" and c not in known]
    if not violated:
        return
    lines = [f"  {c}: {res.ordering[c]['detail']}" for c in violated]
    if res.outcome == "passed" and violated == ["declared"]:
        # Only the case's own read/future expectations failed: point at the first failing
        # read step, and do not claim more than was seen (the expectation itself may be what
        # is wrong; the probes, which know the contract, found nothing).
        res.outcome = "failed"
        line = _failed_read_line(inst, results) or inst.line
        res.message = (f"{inst.where(line)}: a read expectation was "
                       "not met: either the backend made the data visible at another time "
                       "than the async contract allows, or the read's expect: is not what the "
                       "contract implies (check it first); the buffers' final values were "
                       "right\n" + "\n".join(lines))
    elif res.outcome == "passed":
        res.outcome = "failed"
        res.message = (f"{inst.where()}: async contract "
                       f"violated ({', '.join(violated)}); the buffers' final values were right\n"
                       + "\n".join(lines))
    elif res.outcome == "failed":
        res.message += "\n  async contract violated too:\n" + "\n".join(lines)
