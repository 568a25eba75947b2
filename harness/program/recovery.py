"""The rank side of ``reform`` and ``shrink`` (:mod:`harness.casefile.stepkinds.recovery`).

After either, the instance's world is the new default group: ``renv.world_group`` is None and
``renv.remap`` maps a launch rank to its rank in the new world, so the ranks a case names keep
meaning what the case says. The new world is made through the pool's FileStore under a prefix
of its own (the request's sequence number and the step), so two recoveries never meet.

Runs inside rank processes (imports torch).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from ..model import Step


def run(step: Step, idx: int, renv: Any, backend: str) -> None:
    """Re-form or shrink the world on this rank (its errors are the step's)."""
    listed = tuple(int(r) for r in step.value)
    if step.kind == "reform":
        if dist.is_initialized():  # an abort_group step may have ended the world already
            dist.destroy_process_group()
        renv.groups.clear()  # subgroups of the old world died with it
        base = dist.FileStore(renv.store_path, renv.pool_world_size)  # type: ignore[attr-defined]
        store = dist.PrefixStore(f"reform/{renv.seq}/{idx}", base)  # type: ignore[attr-defined]
        dist.init_process_group(backend, store=store, rank=listed.index(renv.rank),
                                world_size=len(listed),
                                timeout=datetime.timedelta(seconds=renv.pg_timeout_s))
        going_on = listed
    else:
        dist.shrink_group([renv.to_global(r) for r in listed])
        renv.groups.clear()
        going_on = tuple(r for r in range(renv.world_size) if r not in listed)
    renv.world_group = None
    renv.remap = {r: i for i, r in enumerate(going_on)}
