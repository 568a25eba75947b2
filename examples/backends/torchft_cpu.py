"""torchft's CPU process groups as ``torch.distributed`` backends (a draft adapter)."""
from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torchft import process_group as tpg


def _form(pg: Any, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    store.set(f"torchft/handle/{rank}", pg.get_reconfigure_handle())
    if rank == 0:
        store.set("torchft/uuid", str(uuid.uuid4().int & ((1 << 63) - 1)))
    keys = ["torchft/uuid", *(f"torchft/handle/{p}" for p in range(size))]
    store.wait(keys, timeout)
    cid, *handles = store.multi_get(keys)
    opts = tpg.ReconfigureOptions()
    opts.uuid = int(cid)
    opts.handles = [h.decode() for h in handles]
    opts.timeout = timeout
    pg.reconfigure(opts).wait()
    return pg


def _gloo(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    return _form(tpg.ProcessGroupGloo(timeout=timeout), store, rank, size, timeout)


def _baby(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    return _form(tpg.ProcessGroupBabyGloo(timeout=timeout), store, rank, size, timeout)


dist.Backend.register_backend("torchft-gloo", _gloo, devices=["cpu"])
dist.Backend.register_backend("torchft-babygloo", _baby, devices=["cpu"])
