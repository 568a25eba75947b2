"""The rank side of the recorder: c10d dispatcher ops seen at the Autograd key.

Why this mechanism (measured on torch 2.13, see docs/howto/record.md): DDP's Reducer and
``_broadcast_coalesced`` call ``ProcessGroup::allreduce``/``broadcast`` from C++, so wrapping the
Python functions of ``torch.distributed`` misses them; every ProcessGroup method goes through the
dispatcher as a ``c10d::*`` op, and DTensor/FSDP2 issue ``_c10d_functional::*`` ops. A Python
kernel registered for those ops at the AutogradCPU/AutogradCUDA keys sees all of them and costs
nothing for the other ops (a TorchDispatchMode would put every aten op through Python). It then
redispatches below Autograd, so the op itself runs unchanged. Ops issued beneath Autograd (under
``torch.inference_mode()``, or from inside a tensor subclass's ``__torch_dispatch__``) are not
seen: the functional collectives' ``wait_tensor`` is caught by wrapping the Python function the
async tensor calls instead.

The kernel is on the rank's critical path: it captures what cannot wait (see
:mod:`harness.record.capture`) before issuing the op and appends it to the recorder's queue;
everything else (reading the ReduceOp, unboxing the Work, encoding, writing) is done on the
flusher thread, in batches.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch._C import _distributed_c10d as c10d

from harness.record import native
from harness.record.capture import capture_for, forget_groups, where
from harness.record.recorder import MAX_PENDING, Recorder, install_signals, start_flusher
from harness.record.trace import HOOK_ENV

_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_WORK_TYPES = (torch.ScriptObject, c10d.Work)


def _kernel(rec: Recorder, qualname: str, op: Any) -> Any:
    plan = [(a.name, capture_for(a.name, str(a.type))) for a in op._schema.arguments]
    by_name = {name: (name, cap) for name, cap in plan}
    redispatch = op._handle.redispatch_boxed  # op.redispatch minus one Python frame
    functional = qualname.startswith("_c10d_functional::")
    local = rec.local
    new_works = rec.new_works
    fast = rec.native
    current_thread = threading.current_thread

    def record(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        captured = tuple([(name, cap(value))
                          for (name, cap), value in zip(plan, args, strict=False)])
        if kwargs:
            captured += tuple([(by_name[k][0], by_name[k][1](v)) for k, v in kwargs.items()])
        site, api = where()
        seq = rec.next_seq()
        rec.count_call()
        rec.emit((qualname, captured, api, site, current_thread().name, seq))
        return seq

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        below = keyset & _BELOW_AUTOGRAD
        if getattr(local, "depth", 0) > 0:
            return redispatch(below, *args, **kwargs)
        # Recorded before the op is issued, as the Flight Recorder does: a call that blocks
        # inside the op (monitored_barrier waits in the call itself) or kills the process is
        # then in the trace, which is what a partial recording must show. Issuing first and
        # recording after overlapped the capture with Gloo's queued work, but did not bring
        # the cost under the 5 % budget either (docs/howto/record.md).
        seq = record(args, kwargs)
        local.depth = 1
        if fast is not None:
            fast.enter()  # the c10d ops this op issues are its own, not the user's calls
        try:
            out = redispatch(below, *args, **kwargs)
        finally:
            local.depth = 0
            if fast is not None:
                fast.leave()
        work = out[1] if type(out) is tuple and len(out) == 2 else out
        if isinstance(work, _WORK_TYPES):
            new_works.append((seq, work))  # unboxed later: Recorder.adopt_works
        elif functional:
            _remember_tensors(rec, out, seq)
        return out

    return kernel


def _remember_tensors(rec: Recorder, out: Any, seq: int) -> None:
    for t in out if isinstance(out, (list, tuple)) else [out]:
        if isinstance(t, torch.Tensor):
            rec.tensor_seq[id(t)] = seq
            rec.tensors[id(t)] = t
    if len(rec.tensor_seq) > MAX_PENDING:
        rec.tensor_seq.popitem(last=False)


def _patch_waits(rec: Recorder) -> None:
    orig_wait = c10d.Work.wait
    works = rec.works
    local = rec.local

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        entry = works.pop(id(self), None)
        if entry is None:
            entry = rec.find_work(id(self))
        if entry is not None and getattr(local, "depth", 0) == 0:
            rec.emit((entry[0], "work", rec.call_count(), where()[0]))
        return orig_wait(self, *args, **kwargs)

    setattr(c10d.Work, "wait", wait)  # noqa: B010  (a pybind method: mypy forbids =)
    orig_wait_tensor = fc.wait_tensor

    def wait_tensor(tensor: Any) -> Any:
        if getattr(local, "depth", 0) == 0:
            key = id(tensor)
            seq = rec.tensor_seq.pop(key, None) if rec.tensors.get(key) is tensor else None
            rec.emit((seq, "tensor", rec.call_count(), where()[0]))
        local.depth = getattr(local, "depth", 0) + 1
        try:
            return orig_wait_tensor(tensor)  # type: ignore[no-untyped-call]
        finally:
            local.depth -= 1

    fc.wait_tensor = wait_tensor


_REC: Recorder | None = None
_LIBS: list[Any] = []  # the Library objects must stay alive or their kernels are removed
_ATTACHED: list[bool] = []  # one entry while the kernels are registered


def recorded_calls() -> int:
    """How many calls this process has recorded so far (0 when not recording)."""
    return 0 if _REC is None else _REC.call_count()


_KEYS = ("AutogradCPU", "AutogradCUDA", "AutogradPrivateUse1")


def _register(rec: Recorder) -> None:
    for ns in ("c10d", "_c10d_functional"):
        names = []
        for full in torch._C._dispatch_get_all_op_names():
            name = full.split("::", 1)[1]
            # check_for_nan and _c10d_functional's _helpers move no data between ranks
            if not full.startswith(ns + "::") or full == "c10d::check_for_nan" or (
                    ns == "_c10d_functional" and name.startswith("_")):
                continue
            names.append((full, name))
        if ns == "c10d" and rec.native is not None:
            rec.native.attach([name for _, name in names], list(_KEYS))
            continue
        lib = torch.library.Library(ns, "IMPL")  # type: ignore[no-untyped-call]
        _LIBS.append(lib)
        for full, name in names:
            op = getattr(getattr(torch.ops, ns), name).default
            for key in _KEYS:
                lib.impl(name, _kernel(rec, full, op), key,  # type: ignore[no-untyped-call]
                         with_keyset=True)


def detach() -> None:
    """Unregister the recorder's kernels: until :func:`attach`, collectives go through the
    dispatcher exactly as without the recorder and are not recorded (ci/bench/bench_record.py
    alternates blocks of steps this way, to compare both in the same processes)."""
    for lib in _LIBS:
        lib._destroy()
    _LIBS.clear()
    if _REC is not None and _REC.native is not None:
        _REC.native.detach()
    _ATTACHED.clear()


def attach() -> None:
    """Register the kernels again after :func:`detach` (nothing when recording is off)."""
    if _REC is not None and not _ATTACHED:
        _register(_REC)
        _ATTACHED.append(True)



def install(folder: str) -> None:
    """Start recording this process's collectives into ``folder`` (once per process)."""
    global _REC
    if _REC is not None:
        return
    rec = _REC = Recorder(folder)
    if os.environ.get(HOOK_ENV) == "native":
        try:
            rec.native = native.load()
            native.install(rec.native, rec.start)
        except native.NativeUnavailable as exc:
            rec.hook_note = f" (the C++ kernel could not be loaded: {exc})"
    _register(rec)
    _ATTACHED.append(True)
    _patch_waits(rec)
    atexit.register(rec.close)
    install_signals(rec)
    start_flusher(rec)
    os.register_at_fork(after_in_child=rec.after_fork)
    orig_exit = os._exit

    def _exit(status: int) -> NoReturn:  # a rank that leaves without Python's shutdown: flush first
        try:
            rec.stop(f"os._exit({status})")
        finally:
            orig_exit(status)

    os._exit = _exit
    _patch_destroy(rec)


def _patch_destroy(rec: Recorder) -> None:
    """After ``destroy_process_group`` torch may give a new group a destroyed one's name
    (its name counter restarts): what is queued is written first, then the cached ranks go."""
    c10d_py = dist.distributed_c10d
    orig = c10d_py.destroy_process_group

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        rec.flush()
        try:
            return orig(*args, **kwargs)
        finally:
            forget_groups()
            if rec.native is not None:
                rec.native.forget_groups()

    c10d_py.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group
