"""FSDP2 ``fully_shard`` of a tiny transformer block on CPU/Gloo (mp.spawn, 2 ranks): the
parameters are all-gathered before forward and backward, and the gradients reduce-scattered."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard

STEPS = 2


def run(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64,
                                         batch_first=True),
        torch.nn.Linear(32, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(4, 6, 32, generator=gen)).square().mean().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(free,), nprocs=2)
