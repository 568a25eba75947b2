"""What the installed torch offers, as plain data, gathered away from the pytest process.

The parent decides skips from these facts (:mod:`harness.run.capabilities`) without importing
torch: importing it there cost about 2 s, and each of torch's non-propagating loggers made
pytest's log capture attach and detach a handler around every test phase (about 2.4 s of
the parent's CPU over the bundled suite). :func:`probe_child` gathers the facts in a process
forked from the pools' forkserver (torch is already imported there) and sends them back as
JSON; :func:`gather` does it in the calling process (external-ranks mode, where torch is
loaded anyway). :func:`of` computes them from module objects, so tests can describe an older
torch with a namespace.
"""

from __future__ import annotations

import importlib
import inspect
import json
import multiprocessing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import dtypes, ops

BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
GROUP_CONSTRUCTORS = ("new_group", "new_subgroups", "new_subgroups_by_enumeration",
                      "split_group")
# What the recovery steps call (harness.program.recovery): absent where torch lacks it.
RECOVERY_CALLS = ("shrink_group",)
# Private torch APIs that steps call (harness.program.contract, harness.program.lifecycle);
# "Class.method" (or "module.function") of torch.distributed, or a function of
# torch._C._distributed_c10d.
PRIVATE_API = ("ProcessGroup._get_sequence_number_for_group",
               "ProcessGroup._enable_collectives_timing", "Work._get_sequence_number",
               "Work._get_duration", "Work.get_future_result", "_get_work_registry_size",
               "distributed_c10d._abort_process_group")
# How long the probe process may take: importing a user's backend module can be slow, but a
# module that never returns must not hang the session.
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TorchFacts:
    """The answers :class:`~harness.run.capabilities.Capabilities` needs, as plain data."""

    torch_version: str = ""
    cuda_devices: int = 0
    cuda_names: tuple[str, ...] = ()
    nccl_version: str = ""
    # "" when every --backend-module imported; else why not (every backend skips with it).
    module_error: str = ""
    available: tuple[str, ...] = ()  # built-in backends torch.distributed says are available
    plugins: tuple[str, ...] = ()  # Backend._plugins (upper-case names of registered backends)
    backend_list: tuple[str, ...] = ()  # Backend.backend_list
    ops: tuple[str, ...] = ()  # op-table names whose torch function or method exists
    # Parameter names of torch.distributed callables the skip rules inspect; a name that is
    # missing from torch is absent here, one whose signature cannot be read maps to None.
    params: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ()  # dtype names torch has (of those the harness knows)
    pg_set_timeout: bool = False
    # torch.distributed._functional_collectives.allow_inflight_collective_as_graph_input_ctx
    inflight_ctx: bool = False
    premul_sum: bool = False
    gloo_available: bool = False
    private_api: tuple[str, ...] = ()  # the names of PRIVATE_API this torch has

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TorchFacts:
        raw = json.loads(text)
        tuples = {k: tuple(v) for k, v in raw.items() if isinstance(v, list)}
        params = {k: None if v is None else tuple(v) for k, v in raw["params"].items()}
        return cls(**{**raw, **tuples, "params": params})


def _params(fn: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _has_api(dist: Any, torch: Any, name: str) -> bool:
    if "." in name:
        owner, method = name.split(".")
        return hasattr(getattr(dist, owner, None), method)
    return hasattr(getattr(getattr(torch, "_C", None), "_distributed_c10d", None), name)


def of(dist: Any, torch: Any, funcol: Any = None, **known: Any) -> TorchFacts:
    """The facts of ``dist`` (torch.distributed or a stand-in), ``torch`` and ``funcol``
    (torch.distributed._functional_collectives, or None); ``known`` gives the fields that do
    not come from those objects (torch_version, cuda_devices, ...)."""
    backend = getattr(dist, "Backend", None)
    names = {op.torch_name or op.name for op in ops.ALL_OPS.values()}
    names |= {"P2POp", *GROUP_CONSTRUCTORS, *RECOVERY_CALLS}
    params = {n: _params(getattr(dist, n)) for n in sorted(names) if hasattr(dist, n)}
    wanted = {*dtypes.DTYPES, *dtypes.ALIASES, *dtypes.ALIASES.values()}
    is_available = getattr(dist, "is_backend_available", lambda b: False)
    return TorchFacts(
        available=tuple(b for b in BUILTIN_BACKENDS if is_available(b)),
        plugins=tuple(getattr(backend, "_plugins", {}) or ()),
        backend_list=tuple(getattr(backend, "backend_list", ()) or ()),
        ops=tuple(name for name, op in ops.ALL_OPS.items() if op.available(dist)),
        params=params,
        dtypes=tuple(sorted(n for n in wanted if hasattr(torch, n))),
        pg_set_timeout=hasattr(getattr(dist, "ProcessGroup", None), "set_timeout"),
        inflight_ctx=hasattr(funcol, "allow_inflight_collective_as_graph_input_ctx"),
        premul_sum=hasattr(dist, "_make_nccl_premul_sum"),
        gloo_available=bool(getattr(dist, "is_gloo_available", lambda: False)()),
        private_api=tuple(n for n in PRIVATE_API if _has_api(dist, torch, n)),
        **known)


def gather(backend_modules: tuple[str, ...]) -> TorchFacts:
    """Import torch (and the user's backend modules) here and read what is there."""
    import torch
    import torch.distributed as dist

    error = ""
    for mod in backend_modules:
        try:
            importlib.import_module(mod)
        except Exception as exc:  # every test of that backend will skip with this reason
            error = f"--backend-module {mod} failed to import: {type(exc).__name__}: {exc}"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = tuple(torch.cuda.get_device_name(i) for i in range(count))
    nccl = ""
    if count and dist.is_nccl_available():
        v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    try:
        funcol = importlib.import_module("torch.distributed._functional_collectives")
    except ImportError:
        funcol = None
    return of(dist, torch, funcol, torch_version=str(torch.__version__), cuda_devices=count,
              cuda_names=names, nccl_version=nccl, module_error=error)


def _child(backend_modules: tuple[str, ...], conn: Any) -> None:
    """Entry of the probe process: gather, send the facts as JSON text, exit."""
    try:
        conn.send(gather(backend_modules).to_json())
    finally:
        conn.close()


class ProbeError(RuntimeError):
    """The probe process died or did not answer: nothing is known about torch here."""


def probe_child(start: Callable[[Callable[..., None], tuple[Any, ...]], Any],
                backend_modules: tuple[str, ...]) -> TorchFacts:
    """:func:`gather` in a process started by ``start(target, args)`` (a fork of the pools'
    forkserver: :func:`harness.run.forkserver.start_child`). A probe that dies or does not answer
    within :data:`PROBE_TIMEOUT_S` raises :class:`ProbeError` saying so (each test then
    errors with it), never a hung or crashed session."""
    recv, send = multiprocessing.Pipe(duplex=False)
    proc = start(_child, (backend_modules, send))
    send.close()
    try:
        if recv.poll(PROBE_TIMEOUT_S):
            try:
                return TorchFacts.from_json(recv.recv())
            except EOFError:
                pass
        proc.join(1.0)
        modules = f" and --backend-module {', '.join(backend_modules)}" if (
            backend_modules) else ""
        how = (f"died (exit code {proc.exitcode})" if proc.exitcode is not None else
               f"did not answer within {PROBE_TIMEOUT_S:g} s")
        raise ProbeError(f"the process that imports torch{modules} to see what it offers "
                         f"{how}; run python -c 'import torch' (and import the module) to see why")
    finally:
        recv.close()
        if proc.is_alive():
            proc.kill()
        proc.join()
