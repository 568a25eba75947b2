"""The guard for a ProcessGroup written in Python (a third-party backend, collective-mutate's).

A Python ProcessGroup's methods are called directly (from ``torch.distributed`` and, through
the pybind trampoline, from DDP's C++ Reducer), never through the ``c10d::`` dispatcher ops the
rank kernel is registered for. :func:`wrap_class` wraps the class's methods instead, turning
each call's arguments into the dispatcher op's order so the same sampling, plan and checker
apply (:func:`harness.guard.rank.sampled_call`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from harness.guard import rank as guard_rank
from harness.guard.checker import Guard
from harness.guard.plan import CHECKED
from harness.record.capture import capture_for

Convert = Callable[[Any, tuple[Any, ...]], tuple[Any, ...]]


def _opt(args: tuple[Any, ...], at: int) -> Any:
    return args[at] if len(args) > at else None


def _reduce(opts: Any) -> Any:
    return dist.ReduceOp.SUM if opts is None else opts.reduceOp


# Python method -> (dispatcher op, the arguments in its order)
METHODS: dict[str, tuple[str, Convert]] = {
    "allreduce": ("allreduce_", lambda pg, a: (a[0], pg, _reduce(_opt(a, 1)), None)),
    "broadcast": ("broadcast_", lambda pg, a: (a[0], pg, _opt(a, 1).rootRank,
                                               _opt(a, 1).rootTensor)),
    "allgather": ("allgather_", lambda pg, a: (a[0], a[1], pg)),
    "_allgather_base": ("_allgather_base_", lambda pg, a: (a[0], a[1], pg)),
    "reduce_scatter": ("reduce_scatter_", lambda pg, a: (a[0], a[1], pg, _reduce(_opt(a, 2)))),
    "_reduce_scatter_base": ("_reduce_scatter_base_",
                             lambda pg, a: (a[0], a[1], pg, _reduce(_opt(a, 2)))),
    "send": ("send", lambda pg, a: (a[0], pg, a[1], a[2])),
    "recv": ("recv_", lambda pg, a: (a[0], pg, a[1], a[2])),
}


def inject(g: Guard, fault: str) -> None:
    """A drill: run the job's Gloo groups on collective-mutate's backend with ``fault``, its
    Python ProcessGroup wrapped by the guard."""
    os.environ["COLLECTIVE_MUTANT"] = fault
    from harness.mutate.backend import MutantGloo  # registers the backend
    mod = dist.distributed_c10d
    orig = mod.init_process_group

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if backend in (None, "gloo", "cpu:gloo"):
            backend = "mutant"
        return orig(backend, *args, **kwargs)

    mod.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    wrap_class(g, MutantGloo)


def wrap_class(g: Guard, cls: type) -> None:
    """Wrap ``cls``'s collective methods with the guard (once)."""
    if getattr(cls, "_collective_guard", False):
        return
    for method, (name, convert) in METHODS.items():
        if name not in CHECKED or not hasattr(cls, method):
            continue
        setattr(cls, method, _wrapper(g, getattr(cls, method), name, convert))
    cls._collective_guard = True  # type: ignore[attr-defined]


def _wrapper(g: Guard, orig: Any, name: str, convert: Convert) -> Any:
    op = getattr(torch.ops.c10d, name).default
    caps = [(a.name, capture_for(a.name, str(a.type))) for a in op._schema.arguments]
    family = CHECKED[name][0]

    def method(self: Any, *args: Any) -> Any:
        if g.off or int(getattr(g.local, "depth", 0)) or family not in g.s.families:
            return orig(self, *args)
        try:
            dargs = convert(self, args)
            gname = dist.distributed_c10d._get_process_group_name(self)
        except Exception:  # a form this table does not know: unchecked, never failed
            return orig(self, *args)
        key = (name, gname, int(dargs[2])) if family == "p2p" else (family, gname)
        seq = g.sampled(key)
        if seq < 0:
            return orig(self, *args)
        return guard_rank.sampled_call(g, name, op, lambda _below, *_a: orig(self, *args), None,
                                       dargs, self, gname, seq, caps, g.ordinal - 1)

    return method
