"""A backend whose group is unusable after any error, as torchft's BabyGloo is.

Import it with ``--backend-module tests.spent_backend`` and run ``--backend spent``: Gloo
behind :class:`harness.backends.wrapping.WrappingProcessGroup` that rejects ``reduce`` and,
from that error on, raises on every call on this rank, the pool's health check (a barrier and
an all_gather) included. Each instance's verdict can be right (the rejection is declared or
not); only the record of why its pool was replaced, and the certificate's list of those,
show that every rejection costs a new process group.
"""

# mypy: disable-error-code="override,call-arg,misc"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

from typing import Any

from harness.backends.wrapping import Call, WrappingProcessGroup


class SpentGloo(WrappingProcessGroup):
    """Faithful until its first error; then every call raises."""

    backend_name = "spent"

    spent = False  # per rank process: the group is unusable from the first error on

    def replace(self, call: Call) -> Any:
        if SpentGloo.spent:
            raise RuntimeError("spent: the group is unusable after an earlier error")
        if call.op == "reduce":
            SpentGloo.spent = True
            raise RuntimeError("spent: No backend type associated with device type cpu")
        return None


SpentGloo.register()
