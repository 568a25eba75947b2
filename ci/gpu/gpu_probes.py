"""Host-blocking measurements on one GPU, for ci/gpu-check.sh (part "probes").

The seed articles claim that a synchronous NCCL collective returns to the host once its kernel
is enqueued (only the stream waits), that ``wait()`` on an async NCCL Work orders the current
stream without blocking the host, and that ``torch.cuda.synchronize()`` blocks the host. The
ordering checks of the case library observe this through a delayed peer; at world size 1 (one
GPU hosts one NCCL rank) there is no peer, so this script measures it directly: a sleep kernel
of known length holds the stream, then the call, and the host's clock says whether the call
waited for the kernel. It also checks, for Gloo with CUDA tensors, that a collective issued
behind a slow producer on the stream reads the produced data (Gloo copies through the host, so
it must wait for the stream).

Writes one JSON file; each measurement says what was observed and the figures it rests on.
Whether the first ``recv`` blocks until the data arrived needs two NCCL ranks, so two GPUs:
on one GPU that measurement is recorded as not run, with the reason.

    python ci/gpu/gpu_probes.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

SLEEP_S = 0.3


def calibrate() -> float:
    """Cycles of ``torch.cuda._sleep`` per second on this GPU."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm-up (module load)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / (start.elapsed_time(end) / 1000.0)


def timed(call: Any, cycles_per_s: float) -> dict[str, float]:
    """Host seconds until ``call`` returned, and until the stream drained, behind a sleep."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(SLEEP_S * cycles_per_s))
    t0 = time.perf_counter()
    call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"host_return_s": round(t1 - t0, 4), "stream_drained_s": round(t2 - t0, 4)}


def verdict(fig: dict[str, float], blocks_word: str, early_word: str) -> str:
    """Which of the two the figures support, or 'inconclusive' between them."""
    if fig["host_return_s"] < 0.2 * SLEEP_S:
        return early_word
    if fig["host_return_s"] > 0.8 * SLEEP_S:
        return blocks_word
    return "inconclusive"


def nccl_probes(cycles_per_s: float) -> dict[str, Any]:
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)  # warm-up: the communicator starts lazily
    torch.cuda.synchronize()
    out: dict[str, Any] = {}
    fig = timed(lambda: dist.all_reduce(t), cycles_per_s)
    out["sync_all_reduce"] = {**fig, "observed": verdict(fig, "blocks_host",
                                                         "returns_once_enqueued")}
    work: list[Any] = []
    fig = timed(lambda: work.append(dist.all_reduce(t, async_op=True)), cycles_per_s)
    out["async_all_reduce_call"] = {**fig, "observed": verdict(fig, "blocks_host",
                                                               "returns_once_enqueued")}
    torch.cuda.synchronize()
    fig = timed(lambda: dist.all_reduce(t, async_op=True).wait(), cycles_per_s)
    out["async_all_reduce_wait"] = {**fig, "observed": verdict(
        fig, "wait_blocks_host", "wait_orders_stream_only")}
    fig = timed(torch.cuda.synchronize, cycles_per_s)
    out["cuda_synchronize"] = {**fig, "observed": verdict(fig, "blocks_host", "returns_early")}
    return out


def gloo_probe(cycles_per_s: float) -> dict[str, Any]:
    t = torch.zeros(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    # A slow producer on the stream: the value Gloo must communicate is written after the sleep.
    fig = timed(lambda: (t.fill_(7.0), dist.all_reduce(t)), cycles_per_s)
    got = float(t[0].item())
    return {**fig, "value_after": got, "expected": 7.0,
            "observed": ("reads_produced_data" if got == 7.0 else "read_stale_data"),
            "host": verdict(fig, "blocks_host", "returns_once_enqueued")}


def run(backend: str, fn: Any, cycles_per_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        kwargs: dict[str, Any] = {"device_id": torch.device("cuda", 0)} if backend == "nccl" else {}
        dist.init_process_group(backend, store=store, rank=0, world_size=1, **kwargs)
        try:
            return dict(fn(cycles_per_s))
        finally:
            dist.destroy_process_group()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python ci/gpu/gpu_probes.py OUT.json", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"sleep_s": SLEEP_S}
    if not torch.cuda.is_available():
        result["skipped"] = "no CUDA device on this machine"
    else:
        torch.cuda.set_device(0)
        cps = calibrate()
        result["sleep_kernel_cycles_per_s"] = round(cps)
        for name, backend, fn in (("nccl", "nccl", nccl_probes), ("gloo_cuda", "gloo", gloo_probe)):
            try:
                result[name] = run(backend, fn, cps)
            except Exception as exc:  # a probe that fails is a finding, not the end of the part
                result[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        result["nccl_first_recv_blocks"] = {
            "not_run": "needs two NCCL ranks, so two GPUs: NCCL refuses two ranks of one "
                       "communicator on one GPU (Duplicate GPU detected)"}
    with open(argv[0], "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
