"""DTensor on a 1-D DeviceMesh on Gloo (mp.spawn, 2 ranks): shard a tensor, redistribute it
Shard(0) -> Replicate (an all_gather) and Partial -> Shard(0) (a reduce_scatter), through the
functional collectives DTensor issues."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor


def run(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    sharded = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    full = sharded.redistribute(mesh, [Replicate()]).to_local()
    partial = DTensor.from_local(torch.ones(8, 4) * (rank + 1), mesh, [Partial()])
    reduced = partial.redistribute(mesh, [Shard(0)]).to_local()
    if rank == 0:
        print(full.shape, reduced.shape)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(free,), nprocs=2)
