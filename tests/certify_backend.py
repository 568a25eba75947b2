"""A backend for the certificate's tests: Gloo behind a wrapper with one deliberate flaw.

Registered as ``certfake`` (``--backend-module tests.certify_backend``); ``CERT_FAULT`` (read
in each rank when the group is made) picks the flaw:

- ``none``: faithful;
- ``rank_zero``: ``rank()`` answers 0 on every process (what torchft's wrappers do);
- ``no_gather``: ``gather`` raises RuntimeError, as a backend that does not implement it;
- ``hang_gather``: ``gather``'s Work never completes;
- ``wrong_broadcast``: rank 1 adds 1 to the first element of what a broadcast gives it.
"""

# mypy: disable-error-code="override,call-arg,misc"
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from harness.backends.wrapping import Call, WrappedWork, WrappingProcessGroup

FAULTS = ("none", "rank_zero", "no_gather", "hang_gather", "wrong_broadcast")


class CertFake(WrappingProcessGroup):
    """Gloo, with the flaw ``CERT_FAULT`` names."""

    backend_name = "certfake"

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(store, rank, size, timeout)
        self.fault = os.environ.get("CERT_FAULT", "none")
        if self.fault not in FAULTS:
            raise ValueError(f"CERT_FAULT={self.fault!r}; choose one of {FAULTS}")
        self.me = rank

    def rank(self) -> int:
        return 0 if self.fault == "rank_zero" else self.me

    def replace(self, call: Call) -> Any:
        if self.fault == "no_gather" and call.op == "gather":
            raise RuntimeError("certfake does not implement gather")
        return None

    def finish(self, call: Call, work: Any) -> Any:
        if self.fault == "hang_gather" and call.op == "gather":
            return WrappedWork(work, mode="hang")
        if self.fault == "wrong_broadcast" and call.op == "broadcast" and self.me == 1:
            def bump() -> None:
                for t in call.outputs:
                    t.view(-1)[:1] += 1
            return WrappedWork(work, after=bump)
        return work


CertFake.register()
