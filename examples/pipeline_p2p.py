"""A two-stage pipeline on Gloo (mp.spawn, 2 ranks): stage 0 sends activations forward with
isend, stage 1 sends gradients back; each side waits its irecv before using the buffer."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MICROBATCHES = 4


def run(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    stage = torch.nn.Linear(32, 32)
    for _ in range(MICROBATCHES):
        if rank == 0:
            act = stage(torch.randn(8, 32)).detach()
            dist.isend(act, dst=1).wait()
            grad = torch.empty(8, 32)
            dist.irecv(grad, src=1).wait()
        else:
            act = torch.empty(8, 32)
            dist.irecv(act, src=0).wait()
            out = stage(act.requires_grad_())
            out.sum().backward()
            assert act.grad is not None
            dist.isend(act.grad, dst=0).wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(free,), nprocs=2)
