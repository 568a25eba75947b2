"""A small two-rank Gloo job for tests/test_guard.py: all_reduce, broadcast, all_gather.

``--out FILE`` writes rank 0's final tensor as raw bytes (compared bit for bit with and without
the guard); ``--break-channel`` makes the guard's side channel fail in every rank after init.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class _Broken:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("side channel unreachable (test)")


def run(rank: int, port: int, out: str, broken: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if broken:
        from harness.guard import rank as guard_rank
        g = guard_rank.guard()
        assert g is not None
        g.store = _Broken()
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(3000, generator=gen)
    for _ in range(6):
        dist.all_reduce(x)
        x = x / 2
        dist.broadcast(x, src=1)
        parts = [torch.empty_like(x) for _ in range(2)]
        dist.all_gather(parts, x)
        x = x + parts[0] * 1e-3
    if rank == 0 and out:
        with open(out, "wb") as f:
            f.write(x.numpy().tobytes())
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--break-channel", action="store_true")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, a.out, a.break_channel), nprocs=2)  # type: ignore[attr-defined,no-untyped-call]


if __name__ == "__main__":
    main()
