"""The bundled case library catches a backend that gets collectives wrong.

``tests/fault_backend.py`` is Gloo behind a Python ProcessGroup that injects one fault, picked
by ``COLLECTIVE_FAULT``. A representative quick subset of ``cases/`` (the core cases of every
op family at world size 3, so that rank 1, a root other than rank 0 and a distinct last rank
exist) runs against it once per fault: every fault must turn the instances of every op it
corrupts red, and the faithful wrapper (``none``) must pass them all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import ops

from .helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "cases"

# Case names of the subset (each file's core semantics; no layouts, NaN, misuse or large
# data, and nothing where Gloo itself diverges from the contract, so `none` is all green).
SUBSET = {
    "broadcast.yaml": ["every_root"],
    "reduce.yaml": ["every_dst"],
    "gather.yaml": ["every_dst"],
    "scatter.yaml": ["every_src"],
    "all_gather.yaml": ["list", "into_tensor", "single"],
    "reduce_scatter.yaml": ["list", "tensor", "single"],
    "all_to_all.yaml": ["list", "single_even", "single_uneven"],
    "all_reduce.yaml": ["reduce_ops"],
    "coalesced.yaml": ["all_reduce_coalesced", "all_gather_coalesced",
                       "coalescing_manager_all_reduce", "coalescing_manager_all_gather",
                       "coalescing_manager_reduce_scatter"],
    "objects.yaml": ["all_gather_object", "gather_object", "scatter_object_list",
                     "broadcast_object_list"],
    "p2p.yaml": ["ring_isend_irecv", "batch_ring_both_directions"],
}
KEEP = "float32 or int64 or object"
# -k matches substrings: keep other cases whose names contain a subset name out.
DROP = "stack or inplace or bool or layouts or sizes or nan_inf or avg or gen or bxor"
# The async variants of the collectives repeat their sync ones; point-to-point programs are
# always async (isend/irecv return Works), so they keep theirs.
SYNC_ONLY = "not async or ring_isend_irecv or batch_ring_both_directions"

# Ops each fault corrupts in this subset (reduce's non-root buffers are unspecified, so a
# fault there only shows where rank 1 is the root, which every_dst includes).
ALL_OUTPUT_OPS = {"broadcast", "reduce", "gather", "scatter", "all_gather",
                  "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
                  "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
                  "all_to_all_single", "all_reduce", "all_reduce_coalesced",
                  "all_gather_coalesced", "coalescing_manager_all_reduce",
                  "coalescing_manager_all_gather", "coalescing_manager_reduce_scatter",
                  "all_gather_object", "gather_object", "scatter_object_list",
                  "broadcast_object_list", "isend", "batch_isend_irecv"}
MUST_CATCH = {
    "wrong_value": ALL_OUTPUT_OPS,
    # The object collectives receive into buffers they allocate with torch.empty, not into
    # the harness's poisoned ones: an unwritten trailing byte may by chance hold the right
    # value (recycled memory), so the fault is not guaranteed to show there.
    "unwritten": ALL_OUTPUT_OPS - {"all_gather_object", "gather_object", "scatter_object_list",
                                   "broadcast_object_list"},
    "missing_contribution": {"reduce", "all_reduce", "reduce_scatter", "reduce_scatter_tensor",
                             "reduce_scatter_single", "all_reduce_coalesced", "gather",
                             "all_gather", "all_gather_into_tensor", "all_gather_single",
                             "all_gather_coalesced", "coalescing_manager_all_reduce",
                             "coalescing_manager_all_gather",
                             "coalescing_manager_reduce_scatter", "all_gather_object",
                             "gather_object"},
    "misplaced_chunk": {"gather", "scatter", "all_gather", "all_gather_into_tensor",
                        "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
                        "reduce_scatter_single", "all_to_all", "all_to_all_single",
                        "all_gather_coalesced", "coalescing_manager_all_gather",
                        "coalescing_manager_reduce_scatter", "all_gather_object",
                        "gather_object", "scatter_object_list"},
}
BAD = ("failed", "error", "hang", "crash")


def _missing_ops() -> set[str]:
    """Ops of the table the installed torch lacks (their instances skip)."""
    import torch.distributed as dist

    return {name for name, op in ops.ALL_OPS.items() if not op.available(dist)}


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
         fault: str) -> dict[str, list[str]]:
    """Run the subset on the faulty backend; return op -> outcomes."""
    monkeypatch.setenv("COLLECTIVE_FAULT", fault)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    report = pytester.path / "report.json"
    names = " or ".join(sorted({n for ns in SUBSET.values() for n in ns}))
    files = [str(CASES / f) for f in SUBSET]
    result = pytester.runpytest_subprocess(
        *files, "--backend", "faulty", "--backend-module", "tests.fault_backend",
        "--world-size", "3", "-k", f"({names}) and ({KEEP}) and not ({DROP}) and ({SYNC_ONLY})",
        "--deadline", "20", "--report-json", str(report),
        "--report-md", str(pytester.path / "report.md"), "-p", "no:cacheprovider",
        "--rootdir", str(ROOT), "-q", timeout=HANG_S)
    assert report.exists(), result.stdout.str()[-3000:]
    records = json.loads(report.read_text())["records"]
    by_op: dict[str, list[str]] = {}
    for r in records:
        if r["case"] in SUBSET.get(Path(r["file"]).name, []):
            by_op.setdefault(r["op"], []).append(r["outcome"])
    return by_op


def test_the_faithful_wrapper_passes_the_subset(pytester: pytest.Pytester,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    by_op = _run(pytester, monkeypatch, "none")
    assert set(by_op) >= ALL_OUTPUT_OPS
    missing = _missing_ops()  # skipped with the reason on a torch without them (2.4's *_single)
    bad = {op: outs for op, outs in by_op.items()
           if any(o != "passed" for o in outs) and not (op in missing and set(outs) == {"skipped"})}
    assert not bad, f"the faithful wrapper failed: {bad}"


@pytest.mark.parametrize("fault", sorted(MUST_CATCH))
def test_every_injected_fault_turns_the_ops_it_touches_red(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    by_op = _run(pytester, monkeypatch, fault)
    caught = {op for op, outs in by_op.items() if any(o in BAD for o in outs)}
    missed = {op for op in MUST_CATCH[fault] if op in by_op and op not in _missing_ops()} - caught
    assert not missed, (f"{fault}: no red instance for {sorted(missed)}: "
                        f"{ {op: by_op[op] for op in missed} }")
    assert caught, f"{fault}: nothing failed"
