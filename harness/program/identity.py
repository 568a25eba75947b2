"""The rank side of the ``identity`` step (:mod:`harness.casefile.stepkinds.identity`).

Each answer is asked separately and kept apart in the check, so the record says which of a
group's answers disagrees with the launch (``dist.get_rank`` reads the group's own ``rank()``
on some torch versions and a cached map on others; a backend can get one right and the other
wrong). An answer that raises counts as wrong, with what was raised.

Runs inside rank processes (imports torch).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ..model import Step, TensorCheck
from . import groups as group_steps


def check(idx: int, step: Step, renv: Any, backend: str) -> TensorCheck:
    """What the group of ``step`` answers on this rank, against the launch."""
    name = str(step.value)
    if name == "world":
        pg, want_rank, want_size = renv.world_group, renv.rank, renv.world_size
    else:
        pg, order = group_steps.resolve(renv.named, name, renv.rank)
        want_rank, want_size = order.index(renv.rank), len(order)
    obj: Any = pg if pg is not None else dist.group.WORLD
    asked: list[tuple[str, Any, Callable[[], Any]]] = [
        ("dist.get_rank(group)", want_rank, lambda: dist.get_rank(pg)),
        ("group.rank()", want_rank, lambda: obj.rank()),
        ("dist.get_world_size(group)", want_size, lambda: dist.get_world_size(pg)),
        ("group.size()", want_size, lambda: obj.size()),
        ("dist.get_backend(group)", backend, lambda: dist.get_backend(pg)),
    ]
    out = TensorCheck(tensor=f"identity of {name} (step {idx})", ok=True,
                      expectation="explicit", total=len(asked))
    for pos, (what, want, ask) in enumerate(asked):
        try:
            got = ask()
        except Exception as exc:  # an answer that raises is a wrong answer, said as such
            out.first_wrong.append((pos, f"{what} = {want!r}",
                                    f"raised {type(exc).__name__}: {str(exc)[:150]}"))
            continue
        if not _same(want, got):
            out.first_wrong.append((pos, f"{what} = {want!r}", f"{got!r}"))
    out.wrong = len(out.first_wrong)
    out.ok = out.wrong == 0
    return out


def _same(want: Any, got: Any) -> bool:
    if isinstance(want, str):
        # A multi-device backend string ("cpu:gloo,cuda:nccl") names the backend per device.
        text = str(got).lower()
        return text == want.lower() or want.lower() in re.split(r"[:,]", text)
    return type(got) is int and got == want
