"""The rank programs ci/bench/bench_record.py runs (as scripts, with and without the recorder).

Each prints nothing and writes one JSON object per rank to ``<out>.<rank>``. Both use
``mp.spawn`` with 2 ranks on Gloo, ``torch.set_num_threads(1)`` (a 2-core machine runs both).
"""

STEP = r'''
import json, os, socket, statistics, sys, time, torch, torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

def calls():
    try:
        from harness.record.hook import recorded_calls
    except ImportError:
        return 0
    return recorded_calls()

def run(rank, port, warmup, steps, blocks, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    layers = []   # examples/ddp_buckets.py's model, as shipped
    for _ in range(6):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    ddp = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(rank))

    def step():
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()

    for _ in range(warmup):   # DDP rebuilds its buckets after the first iteration
        step()
    if blocks:
        json.dump(interleaved(step, blocks, steps), open(f"{out}.{rank}", "w"))
        dist.destroy_process_group()
        return
    dist.barrier()            # both ranks start the timed steps together; no sync inside
    times = []
    c0, p0, t0 = calls(), time.process_time(), time.perf_counter()
    for _ in range(steps):
        s = time.perf_counter()
        step()
        times.append(time.perf_counter() - s)
    t1, p1, c1 = time.perf_counter(), time.process_time(), calls()
    cpu = p1 - p0  # this rank process, all threads (Gloo's, the flusher), ns clock
    json.dump({"median_s": statistics.median(times), "mean_s": (t1 - t0) / steps,
               "cpu_s": cpu / steps, "calls": (c1 - c0) / steps}, open(f"{out}.{rank}", "w"))
    dist.destroy_process_group()

def interleaved(step, pairs, steps):
    # One recorded launch: per pair, a block of steps with the recorder's kernels detached
    # (the dispatcher as without it) and one attached, adjacent, in alternating order; both
    # ranks switch at the same step (DDP keeps them in lockstep), a barrier after each switch.
    from harness.record import hook
    got = []
    for i in range(pairs):
        pair = {}
        for attached in ((False, True) if i % 2 == 0 else (True, False)):
            (hook.attach if attached else hook.detach)()
            dist.barrier()
            times = []
            p0 = time.process_time()
            for _ in range(steps):
                s = time.perf_counter()
                step()
                times.append(time.perf_counter() - s)
            pair[attached] = (statistics.median(times), (time.process_time() - p0) / steps)
        got.append([pair[False][0], pair[True][0], pair[False][1], pair[True][1]])
    hook.attach()
    return {"pairs": got}

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port, *map(int, sys.argv[1:4]), sys.argv[4]), nprocs=2)
'''

CALLS = r'''
import json, os, socket, statistics, sys, time, torch, torch.distributed as dist
import torch.multiprocessing as mp

def run(rank, port, calls, numel, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    pg = dist.group.WORLD
    t = torch.zeros(numel)
    got = {}
    # ddp: issued through ProcessGroup.allreduce and waited on its future, as DDP's Reducer
    # does in C++ (no Python Work.wait); api: dist.all_reduce(async_op=True) + Work.wait()
    ways = {"ddp": lambda: pg.allreduce([t]).get_future().wait(),
            "api": lambda: dist.all_reduce(t, async_op=True).wait()}
    for name, one in ways.items():
        for _ in range(50):
            one()
        dist.barrier()
        batch, thread = calls // 20, []
        p0, w0 = time.process_time(), time.perf_counter()
        for _ in range(20):
            c = time.thread_time()
            for _ in range(batch):
                one()
            thread.append((time.thread_time() - c) / batch)
        p1, w1 = time.process_time(), time.perf_counter()
        n = 20 * batch
        got[name] = {"thread_min_s": min(thread), "thread_median_s": statistics.median(thread),
                     "process_s": (p1 - p0) / n,
                     "wall_s": (w1 - w0) / n}
    json.dump(got, open(f"{out}.{rank}", "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port, int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]), nprocs=2)
'''
