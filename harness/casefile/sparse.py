"""Sparse COO buffers: ``layout: sparse_coo`` and its ``sparse:`` options.

A sparse buffer is declared by its dense values (the usual fill over ``shape``); the rank
stores their non-zero elements as a sparse COO tensor (:func:`harness.program.tensors.
to_sparse`), so the reference model and every expectation work on dense forms. Gloo's
all_reduce takes such tensors (SUM only); this module checks where the layout may be used.
Runs in the pytest process: no torch.
"""

from __future__ import annotations

import math
from typing import Any

from .. import ops
from ..errors import CaseFileError
from ..model import Case, SparseSpec
from .fields import as_list

SPARSE = "sparse_coo"
Path = tuple[Any, ...]


def _single_tensor_ops() -> str:
    return ", ".join(sorted(o.name for o in ops.ALL_OPS.values()
                            if o.roles and all(r.form == "tensor" for r in o.roles)))


def sparse_tensors(case: Case) -> set[str]:
    """Names of the steps form's tensors that are sparse in some instance."""
    case_layouts = as_list(case.raw.get("layout", "contiguous"))
    return {name for name, spec in case.raw.get("tensors", {}).items()
            if SPARSE in as_list(spec.get("layout", case_layouts))}


def check_case(case: Case) -> list[CaseFileError]:
    """Where ``sparse_coo`` and ``sparse:`` may appear (the rest is the schema's job)."""
    raw = case.raw
    errs: list[CaseFileError] = []
    case_layouts = as_list(raw.get("layout", "contiguous"))
    if "sparse" in raw and SPARSE not in case_layouts:
        errs.append(case.error(("sparse",), "'sparse' describes a sparse COO buffer, but the "
                               "case's layout is not sparse_coo", "add 'layout: sparse_coo' or "
                               "drop 'sparse'"))
    op = ops.ALL_OPS.get(raw.get("op", ""))
    if op is not None and SPARSE in case_layouts:
        lists = [r.name for r in op.roles if r.form != "tensor"]
        if lists or not op.roles:
            errs.append(case.error(
                ("layout",), f"layout sparse_coo needs buffers that are single tensors; "
                f"{op.name} takes " + (f"lists or objects ({', '.join(lists)})" if lists
                                       else "no buffer"),
                "ops whose buffers are single tensors: " + _single_tensor_ops()))
        if "entry_shape" in raw:
            errs.append(case.error(("layout",), "a buffer with per-entry shapes cannot be "
                                   "sparse", "drop layout sparse_coo or entry_shape"))
    sparse = sparse_tensors(case)
    for name, spec in raw.get("tensors", {}).items():
        path: Path = ("tensors", name)
        if "sparse" in spec and name not in sparse:
            errs.append(case.error((*path, "sparse"), f"tensor {name!r} has 'sparse' but its "
                                   "layout is not sparse_coo", "add 'layout: sparse_coo' to it"))
        if name in sparse and spec.get("dtype") == "object":
            errs.append(case.error((*path, "dtype"), f"object buffer {name!r} cannot be sparse",
                                   "sparse_coo applies to tensors"))
        if name in sparse and "entries" in spec:
            errs.append(case.error((*path, "entries"), f"tensor {name!r} has per-entry shapes "
                                   "and cannot be sparse", "drop layout sparse_coo or entries"))
    for idx, step in enumerate(raw.get("steps", [])):
        step_op = ops.ALL_OPS.get(step.get("op", ""))
        if step_op is None:
            continue
        for role in step_op.roles:
            tname = step.get(role.name)
            if (isinstance(tname, str) and role.form in ("list", "nested") and tname in sparse
                    and raw["tensors"][tname].get("dtype") != "object"):
                errs.append(case.error(
                    ("steps", idx, role.name), f"{step_op.name}'s {role.name!r} buffer is a "
                    f"list, and the sparse tensor {tname!r} cannot be split into entries",
                    f"name one tensor per entry: '{role.name}: [{tname}, ...]'"))
    return errs


def spec(case: Case, path: Path, raw: dict[str, Any], layout: str,
         shapes: list[tuple[int, ...] | None]) -> SparseSpec | None:
    """The SparseSpec of a buffer with ``layout`` (None unless sparse_coo); ``raw`` is the
    mapping holding its ``sparse:`` key, ``path`` that mapping's path, ``shapes`` its
    per-rank shapes (None where taken from explicit values)."""
    if layout != SPARSE:
        return None
    conf = raw.get("sparse", {})
    dim = conf.get("sparse_dim")
    for shape in shapes:
        if dim is not None and shape is not None and dim > len(shape):
            raise case.error((*path, "sparse", "sparse_dim"),
                             f"sparse_dim {dim} exceeds the {len(shape)} dim(s) of shape "
                             f"{list(shape)}", f"give 1..{len(shape)}" if shape else
                             "a 0-dim buffer takes no sparse_dim")
    return SparseSpec(dim, bool(conf.get("uncoalesced", False)))


def bytes_bound(shape: tuple[int, ...], itemsize: int, sp: SparseSpec) -> int:
    """The most bytes a sparse buffer of ``shape`` can take on a rank: the dense fill it is
    built from, plus the COO tensor if every element is non-zero (int64 indices per stored
    entry, twice the entries when ``uncoalesced``). Index overhead can make this many times
    the dense size (a fully sparse 3-d int8 buffer: 1 + 2 x (3 x 8 + 1) bytes per element)."""
    numel = math.prod(shape)
    sd = len(shape) if sp.sparse_dim is None else sp.sparse_dim
    entries = math.prod(shape[:sd]) * (2 if sp.uncoalesced else 1)
    values = numel * itemsize * (2 if sp.uncoalesced else 1)
    return numel * itemsize + values + entries * max(sd, 1) * 8
