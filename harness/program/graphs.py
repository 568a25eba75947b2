"""CUDA-only steps on a rank: graph capture and replay, stream waits, block_current_stream.

The parent skips these instances where there is no GPU (:mod:`harness.run.capabilities`), so
this code runs only on CUDA ranks; reached on a CPU rank anyway (an external launcher that
ignored the skip, say) it raises, so that a step that did not run never counts as passed.
A capture records the op and wait steps it lists with ``torch.cuda.graph``: nothing runs
while recording, and a graph's values change only when it is replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..model import Step

# Runs one op or wait step of a capture: (step, works issued inside this capture by handle).
RunInner = Callable[[Step, dict[str, Any]], None]


class Graphs:
    """The CUDA graphs a program captured on this rank, by name."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.graphs: dict[str, Any] = {}

    def need_cuda(self, step: Step) -> None:
        """Refuse a CUDA step on a rank whose tensors are not on a GPU."""
        if self.device != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"step {step.kind!r} needs CUDA tensors and a GPU; this rank "
                               f"runs on {self.device!r}"
                               + ("" if torch.cuda.is_available() else " without CUDA"))

    def capture(self, step: Step, run_inner: RunInner) -> None:
        """Record ``step.steps`` into a new graph named ``step.handle`` (replacing one of the
        same name, as upstream's re-capture loop does)."""
        self.need_cuda(step)
        graph = torch.cuda.CUDAGraph()
        works: dict[str, Any] = {}
        with torch.cuda.graph(graph):
            for inner in step.steps:
                run_inner(inner, works)
            for work in works.values():  # validation makes every handle waited inside
                work.wait()
        self.graphs[str(step.handle)] = graph

    def replay(self, step: Step) -> None:
        """Replay a captured graph ``step.value`` times on the current stream."""
        self.need_cuda(step)
        name = step.waits[0]
        graph = self.graphs.get(name)
        if graph is None:
            raise RuntimeError(f"graph {name!r} was not captured on this rank (its capture "
                               "step has a 'ranks:' that leaves this rank out?)")
        for _ in range(int(step.value)):
            graph.replay()

    def block_current_stream(self, step: Step, work: Any) -> None:
        """``work.block_current_stream()``: the current stream waits for the work, the host
        does not."""
        self.need_cuda(step)
        if work is None:
            raise RuntimeError(f"handle {step.waits[0]!r} is not open on this rank")
        work.block_current_stream()

    def wait_stream(self, step: Step, side: Any) -> None:
        """The current stream waits for the side stream (nothing to wait for when no op ran
        on it yet)."""
        self.need_cuda(step)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
