"""Per-case environment variables and process-group timeout (``env:``, ``pg_timeout:``).

Both must be in place before the process group starts, so they are part of the pool key:
instances with different values never share ranks. Only variables that change how a backend
behaves, listed here per backend, may be set (anything else could change the harness itself
or leak into other cases); a list of values is a matrix axis (``env.NAME``).
"""

from __future__ import annotations

from typing import Any

from ..errors import CaseFileError
from ..model import Case
from .fields import suggest

# Variables a case may set, per backend ("*": every backend). Each changes backend
# behaviour that upstream's tests exercise; docs/reference/environment.md.
ALLOWED: dict[str, tuple[str, ...]] = {
    "*": ("TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "PYTORCH_CUDA_ALLOC_CONF"),
    "gloo": ("TORCH_GLOO_LAZY_INIT", "GLOO_SOCKET_IFNAME"),
    "nccl": ("TORCH_NCCL_NAN_CHECK", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
             "TORCH_NCCL_USE_COMM_NONBLOCKING", "TORCH_NCCL_HIGH_PRIORITY",
             "TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_PROPAGATE_ERROR", "NCCL_ALGO", "NCCL_PROTO",
             "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"),
}


def backends_of(name: str) -> tuple[str, ...]:
    """The backends for which ``name`` may be set ("*": all)."""
    return tuple(b for b, names in ALLOWED.items() if name in names)


def check(case: Case) -> list[CaseFileError]:
    """Unknown names, and names meant for a backend the case does not restrict itself to."""
    errs: list[CaseFileError] = []
    env = case.raw.get("env", {})
    every = sorted({n for names in ALLOWED.values() for n in names})
    for name in env:
        owners = backends_of(name)
        if not owners:
            errs.append(case.error(("env", name), f"environment variable {name!r} is not on "
                                   "the allow-list", suggest(name, every)))
        elif "*" not in owners:
            listed = case.raw.get("backends")
            if not listed or any(b not in owners for b in listed):
                errs.append(case.error(("env", name), f"{name} applies to "
                                       f"{', '.join(owners)} only",
                                       f"add 'backends: [{owners[0]}]' to the case"))
    return errs


def axis_values(value: Any) -> list[str]:
    """An env value (or list of values: an axis) as strings, YAML scalars kept verbatim."""
    values = value if isinstance(value, list) else [value]
    return [("1" if v else "0") if isinstance(v, bool) else str(v) for v in values]
