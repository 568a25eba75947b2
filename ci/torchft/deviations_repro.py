"""The deviations from torch's documented ProcessGroup contract that the torchft certificate
found in torchft's ProcessGroupGloo, reproduced with torch and torchft only (no harness).

1. ``rank()`` answers 0 on every process. torch documents ``ProcessGroup.rank()`` as this
   process's rank in the group, and reads it (through ``dist.get_rank()``) for the root checks
   of gather/scatter and the object collectives and for the ranks of every group made from the
   world. torchft's ``ProcessGroupWrapper`` calls ``ProcessGroup.__init__(self, 0, 1)`` and
   overrides ``size()`` but not ``rank()``.
2. ``allreduce(tensors)`` without options, an overload torch's ProcessGroup offers (SUM by
   default), raises TypeError: the wrapper's ``allreduce`` requires ``opts``.
3. The Work of an async ``dist.all_to_all_single`` on a torchft group reports
   ``is_completed() == False`` after its ``wait()`` returned True (an all_reduce's reports
   True): torch documents ``wait()`` as blocking until the work is completed.
4. ``set_timeout`` does not apply to the collectives: after ``set_timeout(2 s)``, an
   all_reduce a peer does not join still waits for the group's original timeout (torchft
   keeps the value for its next reconfigure only).

    python ci/torchft/deviations_repro.py   # one line per check and process; exit 1 if any deviates
"""

from __future__ import annotations

import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
LATE_S = 8.0  # how late rank 1 joins the all_reduce that must time out after 2 s


def _factory(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A torchft ProcessGroupGloo formed on the store torch hands a backend factory."""
    from torchft.process_group import ProcessGroupGloo, ReconfigureOptions

    pg = ProcessGroupGloo(timeout=timeout)
    store.set(f"handle/{rank}", pg.get_reconfigure_handle())
    if rank == 0:
        store.set("uuid", str(uuid.uuid4().int & ((1 << 63) - 1)))
    keys = ["uuid", *(f"handle/{r}" for r in range(size))]
    store.wait(keys, timeout)
    cid, *handles = store.multi_get(keys)
    opts = ReconfigureOptions()
    opts.uuid, opts.handles, opts.timeout = int(cid), [h.decode() for h in handles], timeout
    pg.reconfigure(opts).wait()
    return pg


def rank_main(rank: int, port: int, out: Any) -> None:
    dist.Backend.register_backend("torchft-gloo", _factory, devices=["cpu"])
    dist.init_process_group("torchft-gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=WORLD)
    pg = dist.group.WORLD
    assert pg is not None
    lines = []
    got = pg.rank()
    lines.append(f"rank(): {got}" + (" as documented" if got == rank else
                                    f" DEVIATES (expected {rank})"))
    try:
        pg.allreduce([torch.ones(4)]).wait()
        lines.append("allreduce(tensors) without options: as documented")
    except TypeError as exc:
        lines.append(f"allreduce(tensors) without options: DEVIATES ({exc})")
    work = dist.all_to_all_single(torch.zeros(4), torch.ones(4), async_op=True)
    assert work is not None
    waited = work.wait()
    done = work.is_completed()
    lines.append(f"all_to_all_single Work: wait() = {waited}, then is_completed() = {done}"
                 + (" as documented" if done else " DEVIATES (expected True)"))
    # 4: rank 1 joins the all_reduce only after LATE_S; rank 0 set a 2 s timeout first.
    pg.set_timeout(timedelta(seconds=2))
    t0 = time.monotonic()
    if rank == 1:
        time.sleep(LATE_S)
    try:
        dist.all_reduce(torch.ones(4))
        took, raised = time.monotonic() - t0, False
    except RuntimeError:
        took, raised = time.monotonic() - t0, True
    if rank == 0:
        ok = raised and took < LATE_S
        lines.append(f"all_reduce after set_timeout(2 s), peer {LATE_S:g} s late: "
                     + (f"raised after {took:.1f} s as documented" if ok else
                        f"{'raised' if raised else 'completed'} after {took:.1f} s DEVIATES "
                        "(expected a timeout after about 2 s)"))
    out[rank] = lines
    dist.destroy_process_group()


def main() -> int:
    port = 29000 + uuid.uuid4().int % 2000
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(rank_main, args=(port, out), nprocs=WORLD, join=True)
        got = dict(out)
    deviates = False
    for rank in range(WORLD):
        for line in got[rank]:
            print(f"process {rank}: {line}")
            deviates |= "DEVIATES" in line
    return 1 if deviates else 0


if __name__ == "__main__":
    sys.exit(main())
