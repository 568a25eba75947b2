"""The rank side of the guard: a dispatcher kernel that samples calls, a checker thread.

The kernel is registered for the checked ``c10d::`` ops (:data:`plan.CHECKED`) at the Autograd
keys, as the recorder's is (see :mod:`harness.record.hook` for why that key sees DDP's C++
calls too). It is the C++ kernel of ``harness/record/native/guard.cpp`` (built by the launcher
into the recorder's extension): an unsampled call costs a counter step and the redispatch and
never enters Python, because a Python kernel made every call pay the dispatcher's boxing into
Python (a DDP step x1.55 at 1 in 100). A sampled call (the N-th per op family and group, the
same call on every rank) of dense CPU tensors is digested by that kernel too, in C++: the
inputs before it is issued, the outputs in a callback on its Work's future (the caller gets a
Work that completes after that callback, so DDP's overlap of communication with the backward
pass stays and nobody sees the output before it is digested), a received buffer when its Work
is waited. It enters Python only to walk the stack for the call site.

Other sampled calls take the Python path: :func:`prepare` takes their input digests with torch
ops (:mod:`harness.guard.digest`), the call is issued, and :func:`complete` arranges the output
digests (a CPU collective in a callback on its future, as above; on CUDA, written and not run,
it is waited, which only makes the current stream wait for the op's; a receive when its Work is
waited: ``Work.wait`` is wrapped from the first such receive on). Where the C++ kernel cannot
be built a Python kernel counts and samples, slower. Everything after the digests (publishing
on the store, reading the peers', deciding, writing findings) is the checker thread's
(:mod:`harness.guard.checker`), off the training thread.

Any failure of the guard itself (the store unreachable, a peer's digests never arriving, a
digest that cannot be taken) prints one line and turns the guard off in this rank: the job goes
on as without it. A finding is appended to this rank's findings file and fsync'ed when it is
decided, so a rank that crashes afterwards leaves it on disk.
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
from pathlib import Path
from types import CodeType
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from harness.guard import digest
from harness.guard.calls import Item
from harness.guard.checker import Guard, GuardMismatch, one_line
from harness.guard.plan import CHECKED, group_of, plan_for, reduce_name
from harness.guard.settings import Settings, SettingsError, from_env
from harness.record import native
from harness.record.capture import (
    GROUP,
    REDUCE,
    call_json,
    capture_for,
    capture_group_name,
    classify,
    where,
)

_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_KEYS = ("AutogradCPU", "AutogradCUDA", "AutogradPrivateUse1")
def _kernel(g: Guard, name: str, op: Any) -> Any:
    """The Python kernel: used only where the C++ one cannot be built (every call enters
    Python here; see the module doc)."""
    redispatch = op._handle.redispatch_boxed
    pg_at, caps = _arguments(op)
    family = CHECKED[name][0]
    p2p = family == "p2p"
    local = g.local

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        below = keyset & _BELOW_AUTOGRAD
        if g.raise_next:
            text, g.raise_next = g.raise_next, ""
            raise GuardMismatch(text)
        if g.off or bool(kwargs) or int(getattr(local, "depth", 0)):
            return redispatch(below, *args, **kwargs)
        pg = group_of(args[pg_at])
        gname = pg.group_name
        key = (name, gname, int(args[2])) if p2p else (family, gname)
        seq = g.sampled(key)
        if seq < 0:
            return redispatch(below, *args)
        return sampled_call(g, name, op, redispatch, below, args, pg, gname, seq, caps,
                            g.ordinal - 1)

    return kernel


def _arguments(op: Any) -> tuple[int, list[Any]]:
    schema = op._schema.arguments
    pg_at = next(i for i, a in enumerate(schema) if "ProcessGroup" in str(a.type))
    return pg_at, [(a.name, capture_for(a.name, str(a.type))) for a in schema]


def sampled_call(g: Guard, name: str, op: Any, redispatch: Any, below: Any, args: tuple[Any, ...],
                 pg: Any, gname: str, seq: int, caps: list[Any], ordinal: int) -> Any:
    """Issue a sampled call with its digests around it (the Python kernel's and a Python
    ProcessGroup's path; the C++ kernel calls :func:`prepare` and :func:`complete` itself)."""
    item = prepare(g, name, op, args, pg, gname, seq, caps, ordinal, g.step())
    if item is None:
        return redispatch(below, *args)
    g.local.depth = 1
    try:
        out = redispatch(below, *args)
    finally:
        g.local.depth = 0
    complete(g, item, _work(out))
    return out


def _work(out: Any) -> Any:
    return out[1] if type(out) is tuple and len(out) == 2 else out


def prepare(g: Guard, name: str, op: Any, args: tuple[Any, ...], pg: Any, gname: str, seq: int,
            caps: list[Any], ordinal: int, step: int) -> Item | None:
    """A sampled call's item, its input digests taken (before the op overwrites them); None
    when this form is not checked or the guard cannot digest it (then it turns off)."""
    try:
        group = list(dist.get_process_group_ranks(pg))
        plan = plan_for(name, args, group, g.s.chunk)
        if plan is None:
            return None
        captured = tuple(_capture(n, cap, v, group) for (n, cap), v in zip(caps, args,
                                                                             strict=False))
        site, api = _site(), where()[1]
        call = call_json(str(op._schema.name), captured, api)
        keep = g.s.keep_inputs
        kept = ([x.detach().clone() for x in plan.inputs]
                if keep and sum(x.numel() for x in plan.inputs) <= keep else [])
    except Exception as exc:
        g.disable(f"cannot digest {name}: {type(exc).__name__}: {exc}")
        return None
    return Item(name, seq, plan, None, call, site, gname, pg.rank(), ordinal, step, kept)


def complete(g: Guard, item: Item, work: Any, wrap: bool = False) -> Any:
    """After a sampled call was issued: arrange its output digests. With ``wrap`` (the C++
    kernel), a CPU collective whose Work has a future is digested in a callback on that future,
    and this returns the future that completes after the callback: the kernel gives the caller
    a Work over it, so the call is not waited here and nobody sees it complete before its
    output is digested. Otherwise (CUDA: the wait only makes the current stream wait for the
    op's; a Python Work; the Python kernel) it is waited here and this returns None."""
    name = item.name
    try:
        pw = work if isinstance(work, c10d.Work) else c10d.Work.unbox(work)
        if name == "recv_":
            _patch_wait(g, type(pw))  # a Python Work overrides wait()
            g.waiting[id(pw)] = (item, pw)
            return None
        if name == "send":
            item.pending = digest.to_host(item.plan.before)
        elif wrap and type(pw) is c10d.Work and all(t.device.type == "cpu"
                                                    for t in item.plan.tensors):
            return _on_completion(g, item, pw)
        else:
            pw.wait()
            item.pending = digest.to_host(item.plan.before + item.plan.after())
    except Exception as exc:
        g.disable(f"cannot digest {name} seq {item.seq}: {type(exc).__name__}: {exc}")
        return None
    g.submit(item)
    return None


def _on_completion(g: Guard, item: Item, pw: Any) -> Any:
    item.landed = threading.Event()

    def landed(fut: Any) -> Any:
        assert item.landed is not None
        try:
            value = fut.value()
        except Exception:  # the op failed: nothing to digest; its error goes to the caller
            item.landed.set()
            raise
        try:
            if not g.off:
                item.pending = digest.to_host(item.plan.before + item.plan.after())
        except Exception as exc:
            g.disable(f"cannot digest {item.name} seq {item.seq}: {type(exc).__name__}: {exc}")
        finally:
            item.landed.set()
            g.wake()
        return value

    done = pw.get_future().then(landed)
    g.submit(item)  # in issue order: the checker waits for item.landed
    return done


_SKIP = (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parents[1]))


def _classify(code: CodeType) -> tuple[bool, str | None, bool]:
    """The C++ kernel's question about a code object on the stack (asked once per code
    object): the recorder's answer, except that nothing of the harness is the user's code."""
    user, dist_fn, api_file = classify(code)
    return user and not code.co_filename.startswith(_SKIP), dist_fn, api_file


def _site() -> str:
    """The user's call site as JSON text: the innermost frame outside torch and the harness."""
    f: Any = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_SKIP) and not name.startswith("<"):
            return json.dumps(f"{name}:{f.f_lineno}")
        f = f.f_back
    return json.dumps("?")


def _capture(name: str, cap: Any, value: Any, group: list[int]) -> Any:
    """An argument as the recorder captures it; the group as its ranks and the reduce op as
    its name, read here (a Python ProcessGroup or a pybind ReduceOp has no boxed form)."""
    if isinstance(value, c10d.ProcessGroup):
        return name, (GROUP, tuple(group))
    if name == "reduce_op":
        return name, (REDUCE, reduce_name(value))
    return name, cap(value)


def _patch_wait(g: Guard, cls: Any = c10d.Work) -> None:
    """Digest a sampled receive when the user's ``wait()`` on its Work returns (once per
    Work class)."""
    if "_collective_guard_wait" in cls.__dict__:
        return
    orig = cls.wait

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        got = orig(self, *args, **kwargs)
        entry = g.waiting.pop(id(self), None) if g.waiting else None
        if entry is not None and not g.off:
            item = entry[0]
            try:
                item.pending = digest.to_host(item.plan.after())
                g.submit(item)
            except Exception as exc:
                g.disable(f"cannot digest recv seq {item.seq}: {type(exc).__name__}: {exc}")
        return got

    setattr(cls, "wait", wait)  # noqa: B010  (a pybind method: mypy forbids =)
    setattr(cls, "_collective_guard_wait", True)  # noqa: B010


_GUARD: list[Guard] = []
_LIBS: list[Any] = []  # the Library objects must stay alive or their kernels are removed


def install(folder: str) -> None:
    """Start guarding this process's collectives (once per process); a bad setting is one line
    and no guard."""
    if _GUARD:
        return
    try:
        settings = from_env()
    except SettingsError as exc:
        print(f"collective-guard: {exc}; the job runs unguarded", file=sys.stderr, flush=True)
        return
    g = Guard(settings, folder)
    _GUARD.append(g)
    wanted = [name for name in CHECKED if name in _wanted(settings)]
    _count_steps(g)
    if settings.hook == "native":
        try:
            _attach_native(g, wanted)
        except native.NativeUnavailable as exc:
            print(f"collective-guard: the C++ kernel could not be loaded ({one_line(str(exc))}); "
                  "using the Python kernel, which makes every call slower", file=sys.stderr,
                  flush=True)
    if g.native is None:
        lib = torch.library.Library("c10d", "IMPL")  # type: ignore[no-untyped-call]
        _LIBS.append(lib)
        for name in wanted:
            op = getattr(torch.ops.c10d, name).default
            for key in _KEYS:
                lib.impl(name, _kernel(g, name, op), key,  # type: ignore[no-untyped-call]
                         with_keyset=True)
    _patch_destroy(g)
    atexit.register(g.finish)


def _attach_native(g: Guard, names: list[str]) -> None:
    """Count and sample in the C++ kernel; enter Python only for a sampled call."""
    mod = native.load()
    table = {}
    for name in names:
        op = getattr(torch.ops.c10d, name).default
        table[name] = (op, *_arguments(op))

    def before(name: str, seq: int, args: tuple[Any, ...], ordinal: int,
               step: int) -> Item | None:
        try:
            if g.off:
                return None
            op, pg_at, caps = table[name]
            pg = group_of(args[pg_at])
            return prepare(g, name, op, args, pg, pg.group_name, seq, caps, ordinal, step)
        except Exception as exc:  # never fail the user's call for the guard's sake
            g.disable(f"cannot digest {name}: {type(exc).__name__}: {exc}")
            return None

    def after(item: Item, outs: tuple[Any, ...]) -> Any:
        try:
            return complete(g, item, outs[-1], wrap=True)
        except Exception as exc:
            g.disable(f"cannot digest {item.name}: {type(exc).__name__}: {exc}")
            return None

    def raise_next() -> None:
        if g.raise_next:
            text, g.raise_next = g.raise_next, ""
            raise GuardMismatch(text)

    def ranks(name: str) -> list[int]:
        return list(capture_group_name(name)[1])

    mod.guard_attach(names, [CHECKED[n][0] for n in names], [table[n][1] for n in names],
                     list(_KEYS), g.s.every, g.s.chunk, g.s.keep_inputs, before, after,
                     raise_next, ranks, _classify)
    g.native = mod
    g.start()  # the checker sleeps in the kernel's queue until a sampled call is digested


def detach() -> None:
    """Unregister the guard's kernel: until :func:`attach`, collectives go through the
    dispatcher as without the guard (ci/bench/bench_guard.py alternates blocks of steps so,
    to compare both in the same processes). Only the C++ kernel can be detached."""
    g = guard()
    if g is not None and g.native is not None:
        g.native.guard_detach()


def attach() -> None:
    """Register the kernel again after :func:`detach`; the counters go on where they were."""
    g = guard()
    if g is not None and g.native is not None:
        g.native.guard_detach()  # never twice: a second registration would override
        g.native.guard_reattach(list(_KEYS))


def _wanted(s: Settings) -> set[str]:
    return {name for name, (family, _) in CHECKED.items() if family in s.families}


def _count_steps(g: Guard) -> None:
    """Count optimizer steps (all optimizers of the process), so that a finding names the
    training step its call was issued in."""

    def stepped(*_: Any) -> None:
        if g.native is not None:
            g.native.guard_step()
        else:
            g.steps += 1

    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(stepped)


def _patch_destroy(g: Guard) -> None:
    mod = dist.distributed_c10d
    orig = mod.destroy_process_group

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:  # the default group: check what is queued first
            g.rank = dist.get_rank() if dist.is_initialized() else -1
            g.finish()
            g.off = True
        elif g.native is not None:  # torch may give a later group this one's name
            g.native.guard_forget_groups()
        return orig(*args, **kwargs)

    mod.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def guard() -> Guard | None:
    """This process's guard (None when not guarding)."""
    return _GUARD[0] if _GUARD else None
