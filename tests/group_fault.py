"""A torch whose ``new_group`` ignores ``sort_ranks=False`` (it always sorts the members).

Imported in every rank with ``--backend-module group_fault`` (the backend stays Gloo): the
harness must notice that the group it was given is not the group the case asked for.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist

_REAL = dist.new_group


@functools.wraps(_REAL)  # keeps new_group's signature: the harness asks for its parameters
def _sorting_new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
    kwargs.pop("sort_ranks", None)
    return _REAL(ranks, *args, **kwargs)


dist.new_group = _sorting_new_group
