"""Gloo: a barrier after a rejected collective can raise that collective's error again.

Found by the pool's health check (a barrier, then an all_gather, after any instance in which a
rank raised): in the Gloo certificate of 2026-11-27 one pool was replaced after
``reduce(AVG)`` on int64, whose rejection ("result type Float can't be cast to the desired
output type Long") every rank had already raised, because the health check's barrier raised
that same error again on one rank. ProcessGroupGloo's barrier waits for the work still listed
as in progress; when the rejected reduce's work is still listed, its error comes back from the
barrier, on one rank or both, and the ranks are out of step from there (the other rank's next
call finds the connection closed). Whether it is still listed is a race: on the 2-core machine
(torch 2.13.0+cpu) it happened within 1 to 182 rounds in every run.

Uses torch only. Run: ``python ci/gloo/barrier_reraise_repro.py [ROUNDS]`` (default 300); one
line per rank, exit 1 when a barrier raised the earlier error (the deviation shows), else 0.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
REJECTED = "can't be cast"


def rank_main(rank: int, store: str, rounds: int, answers: Any) -> None:
    """Reject reduce(AVG) on int64, catch it, then barrier; report the first barrier that
    raises, and what it raised."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=30))
    said = f"rank {rank}: {rounds} barriers after a rejected reduce(AVG, int64) completed"
    for i in range(rounds):
        with contextlib.suppress(RuntimeError):  # rejected, as expected, and seen here
            dist.reduce(torch.arange(4, dtype=torch.int64), dst=WORLD - 1, op=dist.ReduceOp.AVG)
        try:
            dist.barrier()
        except RuntimeError as exc:
            said = f"rank {rank}: round {i}: the barrier raised: {str(exc).splitlines()[0][:150]}"
            break
    answers.put(said)
    answers.close()
    answers.join_thread()  # the line is in the pipe before the process ends
    os._exit(0)  # a group out of step cannot be destroyed in order


def main(argv: list[str]) -> int:
    rounds = int(argv[1]) if len(argv) > 1 else 300
    ctx = mp.get_context("spawn")
    answers = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=rank_main, args=(r, os.path.join(tmp, "store"), rounds,
                                                     answers)) for r in range(WORLD)]
        for p in procs:
            p.start()
        lines = []
        for _ in procs:
            try:
                lines.append(answers.get(timeout=120))
            except queue.Empty:
                lines.append("a rank said nothing within 120 s")
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    for line in sorted(lines):
        print(line)
    print(f"torch {torch.__version__}")
    return 1 if any(REJECTED in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
