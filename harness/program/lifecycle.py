"""Rank side of timeouts, expected step errors and process-group lifecycle.

- :func:`expecting`: a step that declares ``raises:`` may raise; what it raised (type,
  message, seconds since the step was entered) is recorded for the parent, which matches the
  pattern (RE2, :mod:`harness.verdict.steps`), and the program goes on. A step that declares
  ``raises:`` and completes is recorded too ("did not raise").
- :class:`Clock`: for ``blocks_until_all`` steps, CLOCK_MONOTONIC at entry and at completion
  (the call's return for a blocking call, its wait's return for an async one), with the
  host's identity. CLOCK_MONOTONIC is one clock for every process of a Linux host (unlike
  ``time.perf_counter``'s documented per-process reference point), so entries and returns of
  ranks on one host can be compared; across hosts they cannot, and the parent says so.
- :func:`set_timeout`, :func:`destroy` and :func:`abort`: the ``set_timeout``, ``destroy``
  and ``abort_group`` steps.

Runs inside rank processes (imports torch).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import socket
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from ..model import Instance, RankResult, Step

CLOCK = "CLOCK_MONOTONIC"


def monotonic() -> float:
    """Seconds of the host-wide monotonic clock."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@functools.cache
def host_id() -> str:
    """Which host (boot) this process runs on: ranks with equal ids share CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


@contextlib.contextmanager
def expecting(step: Step, idx: int, res: RankResult) -> Iterator[None]:
    """Run a step; with ``raises:`` record (and swallow) its error instead of failing."""
    if step.raises is None:
        yield
        return
    entered = monotonic()
    try:
        yield
    except Exception as exc:  # judged by the parent against the step's pattern
        res.step_errors.append({"step": idx, "raised": True, "type": type(exc).__name__,
                                # its classes, for ``type:`` (a subclass is accepted)
                                "classes": [c.__name__ for c in type(exc).__mro__],
                                "message": str(exc)[:4000],
                                "after_s": round(monotonic() - entered, 6)})
        return
    res.step_errors.append({"step": idx, "raised": False,
                            "after_s": round(monotonic() - entered, 6)})


class Clock:
    """Entry and completion times of the ``blocks_until_all`` steps of one program."""

    def __init__(self, inst: Instance) -> None:
        self.watched = {i for i, s in enumerate(inst.steps) if s.blocks_until_all}
        self.marks: dict[int, list[float | None]] = {}

    def enter(self, idx: int) -> None:
        if idx in self.watched:
            self.marks[idx] = [monotonic(), None]

    def done(self, idx: int) -> None:
        mark = self.marks.get(idx)
        if mark is not None and mark[1] is None:
            mark[1] = monotonic()

    def facts(self) -> dict[str, Any]:
        """What the parent needs (empty when no watched step ran on this rank)."""
        if not self.marks:
            return {}
        return {"clock": CLOCK, "host": host_id(),
                "steps": {str(i): {"enter": m[0], "done": m[1]} for i, m in self.marks.items()}}


def set_timeout(group: Any, seconds: float) -> None:
    """``ProcessGroup.set_timeout`` (capabilities skip instances where it is missing)."""
    group.set_timeout(datetime.timedelta(seconds=seconds))


def abort(group: Any) -> None:
    """Abort a subgroup, or every group of the world when ``group`` is None (torch then
    forgets them, as ``destroy_process_group()`` does; ``reform`` initialises a new world).
    Capabilities skip instances where torch has no ``_abort_process_group``."""
    dist.distributed_c10d._abort_process_group(group)


def destroy(group: Any) -> None:
    """``destroy_process_group`` of a subgroup, or of the world when ``group`` is None."""
    if group is None:
        dist.destroy_process_group()
    else:
        dist.destroy_process_group(group)
