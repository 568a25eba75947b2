"""Write a real NCCL Flight Recorder dump for collective-record --from-trace's tests.

Run on a GPU machine (one GPU: world size 1): ``python ci/gpu/nccl_fr_dump.py OUT_DIR``.
Issues a few collectives (sync and async, a subgroup, a MAX reduce_scatter) with the NCCL
trace buffer on, then writes the JSON dump (``nccl_trace_json_0``) and, for comparison, the
pickle form (``nccl_trace_pickle_0``) the way torch's own dump-on-timeout does. The files are
committed under tests/data/flight_recorder/ and read by tests/test_record_import.py.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d


def main() -> int:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    dist.init_process_group("nccl", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    t = torch.ones(1024, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
    dist.broadcast(t, 0)
    gathered = torch.empty(1024, device="cuda")
    dist.all_gather_into_tensor(gathered, t)
    dist.reduce_scatter_tensor(torch.empty(1024, device="cuda"), t, op=dist.ReduceOp.MAX)
    sub = dist.new_group([0])
    dist.all_reduce(t.half(), group=sub)
    torch.cuda.synchronize()
    json_dump = getattr(c10d, "_dump_nccl_trace_json", None) or c10d._dump_fr_trace_json
    pickle_dump = getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace
    text = json_dump()
    with open(os.path.join(out, "nccl_trace_json_0"), "w" if isinstance(text, str) else "wb") as f:
        f.write(text)
    with open(os.path.join(out, "nccl_trace_pickle_0"), "wb") as f:
        f.write(pickle_dump())
    print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())),
          "json via", json_dump.__name__, "pickle via", pickle_dump.__name__)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
