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

And in torchft's ProcessGroupBabyGloo, which runs the collectives in a worker process:

6. A Work's ``get_future()`` resolves to None: torch documents the future of a collective's
   Work as holding the op's output tensors (a list with the all_reduced tensor).
7. Several futures in flight are lost: the worker's callback for a future sends the id of the
   last command its loop read, not the future's own, so the parent's future handler meets an
   id it already resolved, raises ``KeyError`` and stops; later futures never complete. Three
   async all_reduces, their futures asked for at once, the Works waited in reverse order:
   fewer than three futures complete (within FUTURE_S; a hang here is a timeout, never a hung
   script).

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
FUTURE_S = 15.0  # how long a future may take (and BabyGloo's own timeout for a wait())
RUN_S = 120.0  # the whole of one group's run; past it the processes are killed


def _formed(pg: Any, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """``pg`` (a torchft process group) reconfigured over the store torch hands a factory."""
    from torchft.process_group import ReconfigureOptions

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


def _factory(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A torchft ProcessGroupGloo formed on the store torch hands a backend factory."""
    from torchft.process_group import ProcessGroupGloo

    return _formed(ProcessGroupGloo(timeout=timeout), store, rank, size, timeout)


def _baby_factory(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A torchft ProcessGroupBabyGloo (its collectives run in a worker process it starts)."""
    from torchft.process_group import ProcessGroupBabyGloo

    return _formed(ProcessGroupBabyGloo(timeout=timeout), store, rank, size, timeout)


def baby_main(rank: int, port: int, out: Any) -> None:
    dist.Backend.register_backend("torchft-babygloo", _baby_factory, devices=["cpu"])
    dist.init_process_group("torchft-babygloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=WORLD, timeout=timedelta(seconds=FUTURE_S))
    lines = []
    # 6: the value of a completed all_reduce's future.
    t = torch.full((4,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    assert work is not None
    work.wait()
    value = work.get_future().wait()
    right = (isinstance(value, list) and len(value) == 1 and isinstance(value[0], torch.Tensor)
             and torch.equal(value[0], t))
    lines.append(f"BabyGloo all_reduce future's value: {type(value).__name__}"
                 + (" as documented" if right else " DEVIATES (expected [the summed tensor])"))
    # 7: three futures asked for while their all_reduces are in flight.
    ts = [torch.full((4,), float(rank + 1 + 10 * k)) for k in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    futures = [w.get_future() for w in works if w is not None]
    for w in reversed(works):
        try:
            assert w is not None
            w.wait()
        except Exception as exc:  # BabyGloo's wait() times out after FUTURE_S
            lines.append(f"BabyGloo wait() raised {type(exc).__name__}: {str(exc)[:80]}")
    end = time.monotonic() + FUTURE_S
    while not all(f.done() for f in futures) and time.monotonic() < end:
        time.sleep(0.05)
    done = sum(f.done() for f in futures)
    lines.append(f"BabyGloo three futures in flight, Works waited in reverse order: {done} of 3 "
                 f"completed within {FUTURE_S:g} s" + (" as documented" if done == 3 else
                                                       " DEVIATES (expected 3)"))
    out[rank] = lines
    dist.destroy_process_group()


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


def _run(target: Any, out: Any) -> None:
    """Run ``target`` on WORLD processes; kill them if they are not done within RUN_S."""
    port = 29000 + uuid.uuid4().int % 2000
    ctx = mp.spawn(target, args=(port, out), nprocs=WORLD, join=False)
    end = time.monotonic() + RUN_S
    while time.monotonic() < end:
        if ctx.join(timeout=1.0):
            return
    for p in ctx.processes:
        if p.is_alive():
            p.kill()


def main() -> int:
    deviates = False
    with mp.Manager() as manager:
        for target in (rank_main, baby_main):
            out = manager.dict()
            _run(target, out)
            got = dict(out)
            for rank in range(WORLD):
                for line in got.get(rank, [f"{target.__name__} did not finish within "
                                           f"{RUN_S:g} s DEVIATES"]):
                    print(f"process {rank}: {line}")
                    deviates |= "DEVIATES" in line
    return 1 if deviates else 0


if __name__ == "__main__":
    sys.exit(main())
