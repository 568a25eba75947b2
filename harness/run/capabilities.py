"""Parent-side capability checks: decide skips without starting any rank.

The facts come from :mod:`harness.run.torchfacts`, gathered on the first test that runs in a
process forked from the pools' forkserver: torch is never imported in the pytest process. A
missing capability is a skip with the reason, so a CPU machine running ``--backend nccl``
reports every test as skipped instead of spawning ranks that fail.
"""

from __future__ import annotations

import difflib
import platform
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import ops
from ..errors import quote
from ..model import Instance, flat_steps
from . import torchfacts
from .forkserver import start_child  # a fork of the pools' forkserver: torch is imported
from .torchfacts import BUILTIN_BACKENDS, TorchFacts

# Steps that only mean something on a GPU (docs/howto/async-ordering.md).
CUDA_STEP_KINDS = ("capture", "replay", "wait_stream", "block_current_stream", "set_device",
                   "current_device", "stream_idle")
# The private torch API each API-contract step (or work_state key) calls.
API_OF_STEP = {"seq_number": "ProcessGroup._get_sequence_number_for_group",
               "enable_timing": "ProcessGroup._enable_collectives_timing",
               "work_registry": "_get_work_registry_size",
               "sequence_number": "Work._get_sequence_number",
               "duration": "Work._get_duration", "future_result": "Work.get_future_result",
               "abort_group": "distributed_c10d._abort_process_group"}
# Backends whose collectives a CUDA graph cannot record: Gloo runs them on host threads
# (copying CUDA tensors through the host), which a stream capture cannot contain.
NO_GRAPH_CAPTURE = ("gloo",)


@dataclass(frozen=True)
class Capabilities:
    """What the installed torch and machine offer: the skip rules over :class:`TorchFacts`,
    which hold every fact once (versions and devices included)."""

    facts: TorchFacts = field(default_factory=TorchFacts)

    @property
    def torch_version(self) -> str:
        return self.facts.torch_version

    @property
    def cuda_devices(self) -> int:
        return self.facts.cuda_devices

    @property
    def cuda_names(self) -> list[str]:
        return list(self.facts.cuda_names)

    @property
    def nccl_version(self) -> str:
        return self.facts.nccl_version

    @classmethod
    def of_modules(cls, torch_version: str, cuda_devices: int, dist: Any, torch: Any,
                   funcol: Any = None) -> Capabilities:
        """Capabilities read from module objects (or stand-ins for an older torch)."""
        return cls(torchfacts.of(dist, torch, funcol, torch_version=torch_version,
                                            cuda_devices=cuda_devices))

    def _group_addressing_missing(self, op: ops.Op, args: dict[str, Any]) -> str:
        """The group-form parameter a step uses that the installed torch lacks, or ""."""
        wanted: list[str] = [k for k in ("group_src", "group_dst") if k in args]
        if any(k.endswith(".by_group") for k in args):
            wanted.append("group_peer")
        if not wanted:
            return ""
        name = "P2POp" if "group_peer" in wanted else (op.torch_name or op.name)
        if name in self.facts.params and self.facts.params[name] is None:
            return ""  # present, but its signature cannot be read: assume it has them
        params = self.facts.params.get(name) or ()
        return next((k for k in wanted if k not in params), "")

    def _group_step_missing(self, args: dict[str, Any]) -> str:
        """The group constructor (or its parameter) a new_group step needs that the
        installed torch lacks, or ""."""
        fn_name = {"members": "new_group", "subgroups": "new_subgroups",
                   "enumeration": "new_subgroups_by_enumeration",
                   "split": "split_group"}[args["how"]]
        if fn_name not in self.facts.params:
            return f"torch.distributed.{fn_name}"
        wanted: list[str] = [k for k in ("sort_ranks", "use_local_synchronization")
                             if k in args]
        if args["how"] == "subgroups" and "parent" in args:
            wanted.append("group")
        params = self.facts.params[fn_name]
        if params is None:
            return ""
        missing = next((k for k in wanted if k not in params), "")
        return f"{fn_name} parameter {missing!r}" if missing else ""
    def _nccl_group_crowded(self, inst: Instance, args: dict[str, Any],
                            local_rank: int | None) -> str:
        """Why a group made on NCCL by a program of another backend cannot start here, or "".

        NCCL refuses two members of one communicator on one GPU ("Duplicate GPU detected"),
        and the harness's ranks share the GPUs round-robin (rank r on ``cuda:r % count``), so
        a group with more members than GPUs would fail for a reason the case does not state.
        Members given as expressions count as the whole world (they are per-rank values).
        """
        if args.get("backend") != "nccl" or local_rank is not None:
            return ""
        members = args.get("members")
        size = (len(members) if isinstance(members, tuple) and
                all(isinstance(m, int) for m in members) else inst.world_size)
        if size <= self.cuda_devices:
            return ""
        return (f"a new_group on NCCL needs one GPU per member: {size} members > "
                f"{self.cuda_devices} GPU(s)")

    @staticmethod
    def _cuda_steps(inst: Instance) -> list[str]:
        """The CUDA-only step kinds ``inst`` uses (``stream: side`` ops need ``device:
        cuda``, which the device check below covers)."""
        return sorted({s.kind for s in inst.steps if s.kind in CUDA_STEP_KINDS})

    def skip_reason(self, inst: Instance, local_rank: int | None = None) -> str:
        """Why ``inst`` cannot run here, or "" if it can.

        ``local_rank`` is given by external-ranks mode, where each rank asks for itself: a
        CUDA instance needs a GPU of its own on this node (rank ``local_rank`` uses
        ``cuda:local_rank``), however many ranks the whole world has.
        """
        backend = inst.backend
        if self.facts.module_error:  # a --backend-module failed: whichever backend is tested
            return self.facts.module_error
        if backend in BUILTIN_BACKENDS and backend not in self.facts.available:
            return f"backend {backend!r} is not available in this torch build"
        if backend not in BUILTIN_BACKENDS and not self._registered(backend):
            return (f"backend {backend!r} is not registered; pass --backend-module MODULE that "
                    "calls torch.distributed.Backend.register_backend")
        cuda_only = self._cuda_steps(inst)
        if cuda_only and self.cuda_devices == 0:
            return (f"needs a CUDA device ({', '.join(cuda_only)}); there is none on this "
                    "machine")
        if "capture" in cuda_only and backend in NO_GRAPH_CAPTURE:
            return (f"{backend} cannot record collectives in a CUDA graph (it runs them on "
                    "host threads; graph capture is an NCCL feature)")
        if inst.device == "cuda":
            if self.cuda_devices == 0:
                return "no CUDA device on this machine"
            if local_rank is not None:
                if local_rank >= self.cuda_devices:
                    return (f"local rank {local_rank} has no GPU of its own: "
                            f"{self.cuda_devices} GPU(s) on this node")
            elif backend == "nccl" and self.cuda_devices < inst.world_size:
                return (f"NCCL needs one GPU per rank: world_size {inst.world_size} > "
                        f"{self.cuda_devices} GPU(s)")
        dtypes_used = ({t.dtype for t in inst.tensors} | {inst.dtype}) - {"object"}
        for name in sorted(dtypes_used):
            if name not in self.facts.dtypes:
                return f"torch {self.torch_version} has no dtype {name}"
        if local_rank is not None and (inst.env or inst.pg_timeout is not None):
            # Both must be in place before the process group starts; the launcher started
            # one for the whole run (a pg_timeout case would hang instead of timing out).
            return ("'env:' and 'pg_timeout:' are set before the process group starts; "
                    "external-ranks mode runs every instance on the launcher's one group")
        for step in flat_steps(inst.steps):
            if (step.kind in ("destroy", "abort_group") and local_rank is not None
                    and dict(step.args).get("group") is None):
                verb = "destroys" if step.kind == "destroy" else "aborts"
                return (f"{verb} the default process group, which external-ranks mode runs "
                        "the instance on and needs afterwards; run it on the harness's own "
                        "pools")
            needs = [API_OF_STEP[k] for k in (step.kind, *(a for a, _ in step.args))
                     if k in API_OF_STEP and (k == step.kind or step.kind == "work_state")]
            lacking = [n for n in needs if n not in self.facts.private_api]
            if lacking:
                return f"torch {self.torch_version} has no {lacking[0]} (the {step.kind} step)"
            if step.kind == "shrink" and "shrink_group" not in self.facts.params:
                return f"torch {self.torch_version} has no shrink_group (the shrink step)"
            if step.kind == "set_timeout" and not self.facts.pg_set_timeout:
                return (f"torch {self.torch_version}'s ProcessGroup has no set_timeout "
                        "(the set_timeout step)")
            if step.kind == "new_group":
                missing = self._group_step_missing(dict(step.args))
                if missing:
                    return f"torch {self.torch_version} has no {missing}"
                crowded = self._nccl_group_crowded(inst, dict(step.args), local_rank)
                if crowded:
                    return crowded
            if not step.op:
                continue
            op = ops.get(step.op)
            if op.name not in self.facts.ops:
                seen = f" (the harness has seen it from torch {op.seen_from})" if (
                    op.seen_from) else ""
                return (f"torch {self.torch_version} has no torch.distributed."
                        f"{op.torch_name or op.name}{seen}")
            if op.only_backends and backend not in op.only_backends:
                return f"{op.name} is implemented only for {', '.join(op.only_backends)}"
            missing = self._group_addressing_missing(op, dict(step.args))
            if missing:
                return (f"torch {self.torch_version}'s {op.torch_name or op.name} has no "
                        f"{missing} parameter (group-local addressing)")
        if not self.facts.inflight_ctx and any(s.kind == "wait_tensor" or s.register_work
                                               for s in flat_steps(inst.steps)):
            return (f"torch {self.torch_version} has no allow_inflight_collective_as_"
                    "graph_input_ctx (register_work / wait_tensor)")
        if inst.reduce_op == "premul_sum" and not self.facts.premul_sum:
            return f"torch {self.torch_version} has no PREMUL_SUM"
        return ""

    def metadata(self) -> dict[str, Any]:
        return {
            "torch": self.torch_version,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "hostname": socket.gethostname(),
            "cuda_devices": self.cuda_devices,
            "cuda_device_names": self.cuda_names,
            "nccl_version": self.nccl_version,
            "gloo_available": self.facts.gloo_available,
        }

    def _registered(self, backend: str) -> bool:
        return backend.upper() in self.facts.plugins or backend in self.facts.backend_list

    def unknown_backend(self, backend: str, backend_modules: tuple[str, ...]) -> str:
        """Why ``backend`` names no backend here, as one line for the person who typed it
        (it starts with the quoted name), or "" when torch has it built in or it is registered:
        by ``backend_modules`` (already imported in the probe) or by a torch plugin's
        ``torch.backends`` entry point (loaded when torch was imported there)."""
        if backend in BUILTIN_BACKENDS or self._registered(backend):
            return ""
        if self.facts.module_error:
            return f"{quote(backend)} is not registered: {self.facts.module_error}"
        names = sorted({*BUILTIN_BACKENDS, *self.facts.backend_list,
                        *(p.lower() for p in self.facts.plugins)} - {"undefined"})
        near = difflib.get_close_matches(backend.lower(), names, n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(names)}"
        how = (f"--backend-module {' '.join(backend_modules)} was imported but registered no "
               "backend of that name" if backend_modules else
               "a third-party backend needs --backend-module MODULE, a module that registers "
               "it (torch.distributed.Backend.register_backend)")
        return (f"{quote(backend)} is not a backend torch has built in or one registered here "
                f"({hint}); {how}")



_probe_lock = threading.Lock()
_probed: dict[tuple[str, ...], Capabilities | torchfacts.ProbeError] = {}


def probe(backend_modules: tuple[str, ...]) -> Capabilities:
    """What torch (with the user's backend modules imported) offers, read once per session in
    a process forked from the pools' forkserver (see :mod:`harness.run.torchfacts`)."""
    with _probe_lock:  # ahead-runner threads may ask at the same time
        got = _probed.get(backend_modules)
        if got is None:
            try:
                got = Capabilities(
                    torchfacts.probe_child(start_child, backend_modules))
            except torchfacts.ProbeError as exc:
                got = exc  # every later test gets the same answer, without another wait
            _probed[backend_modules] = got
    if isinstance(got, torchfacts.ProbeError):
        raise got
    return got


def probe_here(backend_modules: tuple[str, ...]) -> Capabilities:
    """:func:`probe` in this process (which imports torch): for processes that have it
    loaded anyway, such as the ranks of external-ranks mode."""
    return Capabilities(torchfacts.gather(backend_modules))

