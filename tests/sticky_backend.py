"""A backend that breaks for good after its first error, as an error-swallowing wrapper did.

Import it with ``--backend-module tests.sticky_backend`` and run ``--backend sticky``: Gloo
behind :class:`harness.backends.wrapping.WrappingProcessGroup` that rejects ``reduce`` (as
torchft's wrappers do: "No backend type associated with device type cpu") and, from that
error on, adds 1 to the first element of every ``all_reduce`` output on this rank. Every other
op stays faithful, so the pool's health check (a barrier and an all_gather) still passes and
the broken ranks are kept for the next instance: only a run on fresh ranks shows that the
failure is state carried from one instance to the next.
"""

# mypy: disable-error-code="override,call-arg,misc"
# (a Python ProcessGroup overrides pybind methods whose stubs list several overloads)
from __future__ import annotations

from typing import Any

from harness.backends.wrapping import Call, WrappedWork, WrappingProcessGroup


class StickyGloo(WrappingProcessGroup):
    """Faithful until its first error; then every all_reduce comes out wrong."""

    backend_name = "sticky"

    broken = False  # per rank process: the state a later instance inherits

    def replace(self, call: Call) -> Any:
        if call.op == "reduce":
            StickyGloo.broken = True  # the error is swallowed into state, and stays
            raise RuntimeError("sticky: No backend type associated with device type cpu")
        return None

    def finish(self, call: Call, work: Any) -> Any:
        if call.op != "all_reduce" or not StickyGloo.broken:
            return work

        def corrupt() -> None:
            for t in call.outputs:
                if t.numel():
                    t.view(-1)[0] += 1

        return WrappedWork(work, after=corrupt)


StickyGloo.register()
