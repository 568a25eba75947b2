"""Prepare an instance: what it becomes on this machine, with this torch, in this session.

The one place where overrides are resolved (with the wrapped backend's, when a capability
manifest says ``inherits:``), the manifest's declared gaps applied, the ordering and perf plans
configured, ``--check-iters`` applied, the capability skip decided and the deadline and pool
key chosen.
Parent side; no torch, no pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..casefile import numerics, overrides
from ..manifest import apply as manifest
from ..model import Instance
from ..ordering import plan as ordering
from ..perf import plan as perfplan
from ..run.capabilities import Capabilities
from ..run.pool import PoolKey, check_deadline
from .settings import RunSettings


@dataclass(frozen=True)
class Prepared:
    """An instance as it will run here, and what was decided about it before it runs."""

    instance: Instance
    deadline_s: float
    skip: str = ""  # why it does not run here ("" when it runs)
    problem: str = ""  # why it cannot be run at all (an error record, "" when it can)
    # Overrides that match but for their torch/NCCL/backend scope (the report lists them).
    not_applied: tuple[dict[str, Any], ...] = ()


def prepare(inst: Instance, settings: RunSettings, caps: Capabilities,
            local_rank: int | None = None) -> Prepared:
    """``inst`` resolved for this torch and NCCL, with the session's ordering and perf plans
    and ``--check-iters``; whether it is skipped here (``local_rank``: external mode, where
    each rank asks for its own devices) and its deadline."""
    inherits = settings.inherits
    not_applied = tuple(overrides.not_applied(inst, caps.torch_version, caps.nccl_version,
                                              inherits))
    resolved = overrides.resolve(inst, caps.torch_version, caps.nccl_version, inherits)
    if settings.manifest is not None:  # after the overrides: a declared gap wins over them
        resolved = manifest.apply(resolved, settings.manifest)
    deadline = resolved.deadline or settings.deadline_s
    problem = ""
    try:
        check_deadline(deadline)
    except ValueError as exc:  # never reaches a pool: a hang would run on unchecked
        problem = f"{exc}; set `deadline:` in the case or --deadline to a number of seconds"
        deadline = settings.deadline_s
    planned = ordering.configure(resolved, settings.ordering)
    planned = perfplan.configure(planned, settings.perf, deadline)
    planned = numerics.check_iters(planned, settings.check_iters)
    planned = numerics.perf_check(planned)
    skip = planned.expectation.skip or caps.skip_reason(planned, local_rank=local_rank)
    return Prepared(planned, deadline, skip, problem, not_applied)


def pool_key(inst: Instance, settings: RunSettings) -> PoolKey:
    """The pool an instance runs on, built from the instance alone (and the session's backend
    modules and environment): everything that makes two instances unable to share ranks."""
    env = inst.env
    if settings.env:  # the session's environment wins over the case's
        env = tuple(sorted({**dict(inst.env), **dict(settings.env)}.items()))
    return PoolKey(inst.backend, inst.device, inst.world_size, settings.backend_modules,
                   env=env, pg_timeout_s=inst.pg_timeout, bind_device=inst.bind_device)
