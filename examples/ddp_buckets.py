"""DDP with small gradient buckets on Gloo (mp.spawn, 2 ranks): the recorder's DDP workload.

``--backend nccl`` runs the same model on CUDA, one GPU per rank (``--world-size 1`` on a
machine with one GPU: NCCL refuses two ranks on one device).

Several buckets (bucket_cap_mb below the size of one layer's gradients), the initial
broadcast of the module's state, three training steps. Prints a digest of the final
parameters on rank 0 (``--out FILE`` writes them as raw bytes) so a run with and without
recording can be compared bit for bit.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

STEPS = 3
LAYERS = 6


def run(rank: int, world: int, port: int, bucket_mb: float, width: int, out: str,
        backend: str = "gloo") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.manual_seed(0)
    # DDP's first bucket holds up to 1 MiB whatever bucket_cap_mb says: six layers of
    # width 256 (1.6 MB of gradients) leave several buckets after it.
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = ddp(torch.randn(16, width, generator=gen).to(device)).square().mean()
        loss.backward()
        opt.step()
    if rank == 0 and out:
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
        with open(out, "wb") as f:
            f.write(flat.numpy().tobytes())
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=0.25)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--out", default="")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(a.world_size, port, a.bucket_mb, a.width, a.out, a.backend),
             nprocs=a.world_size)


if __name__ == "__main__":
    main()
