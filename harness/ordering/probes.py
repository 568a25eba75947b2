"""Rank side of the async-contract checks: the delayed probes.

Runs inside rank processes (imports torch) and only observes: verdicts are computed in the
parent (:mod:`harness.ordering.verdicts`) from the observations returned here. Buffers are
built, ops called and results checked through the step interpreter's public API
(:func:`~harness.program.interpreter.build_buffers`, :func:`~harness.program.interpreter.call_op`,
:func:`~harness.program.interpreter.check_results`); stream semantics come from
:class:`~harness.program.timeline.Device`.

A probe is an extra run of a shorthand async instance on fresh buffers:

- ``post_wait``: one rank (the plan's delayed rank) starts slow work only once every other
  member has signalled, through the rendezvous store, that it is at the call; the others call,
  query ``is_completed()`` (and snapshot the output if it says true), ``wait()``, snapshot the
  output at once (a copy on the current stream, no host synchronize), then settle (device
  synchronize, or poll ``is_completed()`` on CPU, which also ends once the output holds the
  right values: see :meth:`~harness.program.timeline.Device.settle`) and read again: the
  settled read is the baseline that tells ordering faults from plain wrong values;
- ``pre_op``: each rank runs the op once on an input holding old values (so a backend that
  stages or caches its inputs has seen them), then a slow producer (sleep kernel, or host
  sleep) writes the real input, the op runs again and its settled result is checked;
- ``host_blocking``: the blocking form with the delayed rank, timed on the other ranks, and
  its output read right after it returns.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from ..model import Instance
from ..program import interpreter, tensors
from ..program.interpreter import RankEnv
from ..program.timeline import SETTLE_MIN_S, Device, wrong_text

# Settling on CPU polls is_completed() for at most this many delays (and at least
# SETTLE_MIN_S): long enough for a result that lands after the delayed peer, short enough that
# a Work which never reports completion (Gloo's reduce_scatter) costs little.
SETTLE_DELAYS = 5.0
ALIGN_S = 10.0  # longest wait of the delayed rank for the others to reach the call
POLL_S = 0.0005

def _store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no default group store (external launchers may differ): no alignment
        return None


class _Prober:
    """Runs the delayed probes of one shorthand async instance on this rank."""

    def __init__(self, inst: Instance, renv: RankEnv, env: dict[str, Any]) -> None:
        assert inst.ordering is not None and inst.shorthand is not None
        self.inst, self.renv, self.env = inst, renv, env
        self.plan = inst.ordering
        self.dev = Device(renv.device, max(SETTLE_MIN_S, SETTLE_DELAYS * self.plan.delay_s))
        self.step = inst.steps[0]
        self.in_name, self.out_name = inst.shorthand
        self.delayed = renv.rank == self.plan.delayed_rank
        self.store = _store()

    def fresh(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], set[str]]:
        bufs = interpreter.build_buffers(self.inst, self.renv, self.env)
        before = {n: t.detach().cpu().clone() for n, t in bufs.items()}
        return bufs, before, set()

    def call(self, bufs: dict[str, torch.Tensor], touched: set[str], async_op: bool) -> Any:
        return interpreter.call_op(self.inst, replace(self.step, async_op=async_op), self.renv,
                                  self.env, bufs, touched)

    def read(self, bufs: dict[str, torch.Tensor]) -> torch.Tensor:
        return bufs[self.out_name].detach().clone()  # on CUDA: a copy on the current stream

    def check(self, bufs: dict[str, torch.Tensor], before: dict[str, torch.Tensor],
              touched: set[str], snap: torch.Tensor | None = None) -> tuple[bool, bool, str]:
        """(all right, the output was checked on this rank, what was wrong)."""
        view = dict(bufs)
        if snap is not None:
            view[self.out_name] = snap
        checks = interpreter.check_results(self.inst, self.renv, self.env, view, before, touched)
        bad = [c for c in checks if not c.ok]
        text = "; ".join(f"{c.tensor}: {wrong_text(c)}" for c in bad[:2])
        # Only an output the op writes here depends on the other ranks (not one left alone).
        depends = any(c.tensor == self.out_name and c.expectation not in ("untouched",
                                                                          "unchanged")
                      for c in checks)
        return not bad, depends, text

    def align(self, probe: str) -> None:
        """Let the delayed rank start its delay only once every other member is at the call."""
        if self.store is None:
            return
        key = f"collective-harness/ordering/{self.renv.seq}/{probe}"
        if not self.delayed:
            self.store.add(key, 1)
            return
        others = len(self.plan.members) - 1
        end = time.monotonic() + ALIGN_S
        while others and self.store.add(key, 0) < others and time.monotonic() < end:
            time.sleep(POLL_S)

    def post_wait(self) -> dict[str, Any]:
        bufs, before, touched = self.fresh()
        self.dev.sync()
        self.align("post_wait")
        if self.delayed:
            self.dev.delay(self.plan.delay_s)
        work = self.call(bufs, touched, True)
        at_return = bool(work.is_completed())
        early = self.read(bufs) if at_return else None
        work.wait()
        snap = self.read(bufs)
        after_wait = bool(work.is_completed())
        after_sync = None
        if self.dev.cuda:
            self.dev.sync()
            after_sync = bool(work.is_completed())
        self.dev.settle(work, lambda: self.check(bufs, before, touched)[0])
        imm_ok, checked, imm_wrong = self.check(bufs, before, touched, snap)
        set_ok, _, set_wrong = self.check(bufs, before, touched)
        obs: dict[str, Any] = {
            "delayed": self.delayed, "checked": checked, "completed_at_return": at_return,
            "at_return_ok": None, "at_return_wrong": "", "completed_after_wait": after_wait,
            "completed_after_sync": after_sync, "immediate_ok": imm_ok,
            "immediate_wrong": imm_wrong, "settled_ok": set_ok, "settled_wrong": set_wrong}
        if early is not None:
            ok, _, wrong = self.check(bufs, before, touched, early)
            obs.update(at_return_ok=ok, at_return_wrong=wrong)
        return obs

    def pre_op(self, wait_trusted: bool) -> dict[str, Any]:
        """``wait_trusted``: the post-wait probe saw this op's ``wait()`` hand over the right
        values at once on this rank, so the warm-up call is done with the buffers when its
        ``wait()`` returns. Its settle then ends at once instead of polling a Work that never
        reports completion (Gloo's reduce_scatter) for the whole settle time; a Work that
        reports completion settles exactly as before."""
        bufs, before, touched = self.fresh()
        inp = bufs[self.in_name]
        new = inp.detach().clone()
        inp.copy_(tensors.poison(tuple(inp.shape), inp.dtype).to(inp.device))
        warm = self.call(bufs, touched, True)  # the backend sees the buffer with old values
        warm.wait()
        self.dev.settle(warm, (lambda: True) if wait_trusted else None)
        if self.out_name != self.in_name:
            out = bufs[self.out_name]
            out.copy_(tensors.poison(tuple(out.shape), out.dtype).to(out.device))
        self.dev.delay(self.plan.delay_s)  # the slow producer ...
        inp.copy_(new)  # ... whose write lands just before the call (CUDA: behind the sleep)
        work = self.call(bufs, touched, True)
        work.wait()
        self.dev.settle(work, lambda: self.check(bufs, before, touched)[0])
        ok, checked, wrong = self.check(bufs, before, touched)
        return {"ok": ok, "checked": checked, "wrong": wrong}

    def host_blocking(self) -> dict[str, Any]:
        bufs, before, touched = self.fresh()
        self.dev.sync()
        self.align("host_blocking")
        if self.delayed:
            self.dev.delay(self.plan.delay_s)
        t0 = time.perf_counter()
        self.call(bufs, touched, False)
        took = time.perf_counter() - t0
        snap = self.read(bufs)
        self.dev.sync()
        ok, checked, wrong = self.check(bufs, before, touched, snap)
        alone = self.dev.cuda and len(self.plan.members) == 1  # its stream is the slow one
        return {"delayed": self.delayed, "observer": checked and (not self.delayed or alone),
                "return_s": round(took, 6), "immediate_ok": ok, "immediate_wrong": wrong}


def run_probes(inst: Instance, renv: RankEnv, env: dict[str, Any]) -> dict[str, Any]:
    """Run the instance's delayed probes on this rank (members of the op only)."""
    plan = inst.ordering
    if plan is None or not plan.probes or renv.rank not in plan.members:
        return {}
    prober = _Prober(inst, renv, env)
    post = prober.post_wait()
    probes = {"post_wait": post,
              "pre_op": prober.pre_op(bool(post["immediate_ok"] and post["settled_ok"])),
              "host_blocking": prober.host_blocking()}
    prober.dev.sync()
    return {"probes": probes}
