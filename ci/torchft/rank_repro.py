"""torchft's ProcessGroupGloo answers rank() == 0 on every process: a reproduction with torch
and torchft only (no harness).

torch documents ``ProcessGroup.rank()`` as this process's rank in the group, and reads it
(through ``dist.get_rank()``) for the root checks of gather/scatter and the object collectives
and for the ranks of every group made from the world. torchft's ``ProcessGroupWrapper`` calls
``ProcessGroup.__init__(self, 0, 1)`` and overrides ``size()`` but not ``rank()``.

    python ci/torchft/rank_repro.py          # prints one line per rank, exit 1 if it deviates
"""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def rank_main(rank: int, port: int, answers: dict[int, tuple[int, int]]) -> None:
    from torchft.process_group import ProcessGroupGloo, ReconfigureOptions

    timeout = timedelta(seconds=30)
    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timeout)
    pg = ProcessGroupGloo(timeout=timeout)
    store.set(f"handle/{rank}", pg.get_reconfigure_handle())
    if rank == 0:
        store.set("uuid", str(uuid.uuid4().int & ((1 << 63) - 1)))
    keys = ["uuid", *(f"handle/{r}" for r in range(WORLD))]
    store.wait(keys, timeout)
    cid, *handles = store.multi_get(keys)
    opts = ReconfigureOptions()
    opts.uuid, opts.handles, opts.timeout = int(cid), [h.decode() for h in handles], timeout
    pg.reconfigure(opts).wait()
    answers[rank] = (pg.rank(), pg.size())


def main() -> int:
    port = 29000 + uuid.uuid4().int % 2000
    with mp.Manager() as manager:
        answers = manager.dict()
        mp.spawn(rank_main, args=(port, answers), nprocs=WORLD, join=True)
        got = dict(answers)
    deviates = False
    for rank in range(WORLD):
        r, size = got[rank]
        ok = (r, size) == (rank, WORLD)
        deviates |= not ok
        print(f"process {rank}: rank() = {r}, size() = {size}: "
              + ("as documented" if ok else f"DEVIATES (expected rank() = {rank})"))
    return 1 if deviates else 0


if __name__ == "__main__":
    sys.exit(main())
