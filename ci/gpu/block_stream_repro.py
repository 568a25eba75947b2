"""Gloo with CUDA tensors: does ``Work.block_current_stream()`` order the current stream after
the collective's result? torch alone, no harness, for an upstream report.

    python ci/gpu/block_stream_repro.py [--iters 200] [--numel 10,1048576] [--json PATH]

Two Gloo ranks on one GPU. Each iteration: every rank fills ``t`` with ``rank + 1`` on the
current stream, issues ``all_reduce(t, async_op=True)``, calls ``work.block_current_stream()``,
then copies ``t`` on the current stream (``t.clone()``) and only then waits the Work. The
contract (torch's docstring of ``block_current_stream``): the current stream waits for the
collective, so the clone holds the sum, 3. Counts the iterations whose clone held anything
else, per size, and the same with ``work.wait()`` in place of ``block_current_stream()`` as
the control. Exit 0 whatever it finds (it is a probe); the figures are in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, port: int, sizes: list[int], iters: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    found: dict[str, dict[str, int]] = {}
    for numel in sizes:
        t = torch.empty(numel, device="cuda")
        for way in ("block_current_stream", "wait"):
            wrong = 0
            for _ in range(iters):
                t.fill_(rank + 1)
                work = dist.all_reduce(t, async_op=True)
                if way == "wait":
                    work.wait()
                else:
                    work.block_current_stream()
                seen = t.clone()
                if way != "wait":
                    work.wait()
                torch.cuda.synchronize()
                if not bool((seen == 3).all()):
                    wrong += 1
            found[f"{way} numel={numel}"] = {"iters": iters, "wrong": wrong}
    dist.destroy_process_group()
    if rank == 1:
        with open(out, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                       "rank": 1, "results": found}, f, indent=1)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--numel", default="10,1048576")
    p.add_argument("--json", default="block_stream.json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("block_stream_repro: needs a GPU", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sizes = [int(n) for n in a.numel.split(",")]
    mp.spawn(rank_main, args=(port, sizes, a.iters, a.json), nprocs=2)
    with open(a.json) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
