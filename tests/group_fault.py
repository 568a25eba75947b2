"""A torch whose ``new_group`` ignores ``sort_ranks=False`` (it always sorts the members;
on a torch without the parameter it accepts and ignores it).

Imported in every rank with ``--backend-module group_fault`` (the backend stays Gloo): the
harness must notice that the group it was given is not the group the case asked for.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch.distributed as dist

_REAL = dist.new_group


@functools.wraps(_REAL)  # keeps new_group's signature: the harness asks for its parameters
def _sorting_new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
    kwargs.pop("sort_ranks", None)
    return _REAL(ranks, *args, **kwargs)


_SIGNATURE = inspect.signature(_REAL)
if "sort_ranks" not in _SIGNATURE.parameters:
    # torch 2.4 has no sort_ranks: claim one (and ignore it) so that the harness, which skips
    # where the installed new_group lacks the parameter, runs the step and sees the fault.
    _sorting_new_group.__signature__ = _SIGNATURE.replace(  # type: ignore[attr-defined]
        parameters=[*_SIGNATURE.parameters.values(),
                    inspect.Parameter("sort_ranks", inspect.Parameter.KEYWORD_ONLY,
                                      default=True)])

dist.new_group = _sorting_new_group
