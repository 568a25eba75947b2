"""torchft's CPU process groups as ``torch.distributed`` backends: the adapter the project ships.

Imported with ``--backend-module examples.backends.torchft_cpu`` (or through the ``module:`` of
the manifests beside it, ``torchft-gloo.yaml`` and ``torchft-babygloo.yaml``), it registers
torchft's ``ProcessGroupGloo`` as ``torchft-gloo`` and ``ProcessGroupBabyGloo`` as
``torchft-babygloo`` (PyPI ``torchft-nightly``, the version pinned in ``ci/constraints.txt``).
torchft's ``reconfigure`` rendezvouses through handles that name a TCP store, while torch hands
a factory a ``Store``: each rank publishes its handle on that store, rank 0 an id, and every
rank reads them all back before reconfiguring.

``torchft-gloo`` is what the project's tests certify (``tests/test_certify.py``) and what the
committed certificate ``reports/reference/torchft-gloo-certificate/`` was made with.
``ProcessGroupBabyGloo`` starts its worker with ``multiprocessing`` from the rank, which the
harness allows (``docs/howto/third-party-backend.md``, "Ranks may start processes; they end
with the rank"): the worker ends with its rank, whatever ends the rank.
"""
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
