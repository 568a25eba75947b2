"""The catalogue of injected faults (no torch): names, what each one breaks, and its settings.

Each fault corrupts one narrow corner the way real backend bugs do (one dtype, one size range,
one world size, subgroups only, one reduce op, one op's completion semantics ...), so that a
case set that misses that corner lets it survive. :mod:`harness.mutate.backend` implements
them; this module only describes them, for the command line and the report.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKEND = "mutant"  # the name the fault-injecting backend registers under
BACKEND_MODULE = "harness.mutate.backend"
ENV = "COLLECTIVE_MUTANT"  # read in every rank when a process group is created
FAITHFUL = "none"  # the faithful wrapper: Gloo behind the same Python ProcessGroup

LARGE_BYTES = 1 << 20  # "above a size": messages larger than 1 MiB (an algorithm switch)
ODD_WORLD_SIZE = 3  # "only at one world size"
SPLIT_ELEMENTS = 256  # size_dependent_sum: a reduction that switches its chunking above this
BIG_WORLD = 8  # "wrong only at world sizes above": a tree/ring switch nobody runs past 8


@dataclass(frozen=True)
class Fault:
    """One fault class: its name and what it does (the blind spot if it survives)."""

    name: str
    does: str


FAULTS: tuple[Fault, ...] = (
    Fault("bf16_wrong_value", "bfloat16 outputs of every collective have the lowest bit of "
          "their first element flipped (all ranks)"),
    Fault("fp16_wrong_value", "float16 outputs of every collective have the lowest bit of "
          "their first element flipped (all ranks)"),
    Fault("int8_wrong_value", "int8 outputs of every collective have the lowest bit of their "
          "first element flipped (all ranks)"),
    Fault("large_all_reduce_wrong", f"all_reduce of more than {LARGE_BYTES} bytes (an "
          "algorithm switch) has the lowest bit of its last element flipped"),
    Fault("world_size_3_wrong", f"at world size {ODD_WORLD_SIZE} only, all_reduce results "
          "have the lowest bit of their first element flipped"),
    Fault("subgroup_wrong", "on subgroups only (a group smaller than the world), all_reduce "
          "and broadcast results have the lowest bit of their first element flipped"),
    Fault("inplace_wrong", "in-place all_gather / reduce_scatter (the input is a view of the "
          "output or the output of the input) get the last element of the output flipped"),
    Fault("nonzero_root_wrong", "broadcast, reduce, gather and scatter with a root other than "
          "rank 0 deliver a first element with its lowest bit flipped"),
    Fault("bxor_as_bor", "ReduceOp.BXOR is computed as BOR (all_reduce, reduce, "
          "reduce_scatter)"),
    Fault("int_sum_saturates", "all_reduce SUM of integer dtypes saturates at the dtype's "
          "limits instead of wrapping as torch's integer arithmetic does"),
    Fault("p2p_tags_ignored", "send/recv ignore the tag: messages match by order only"),
    Fault("barrier_no_wait", "barrier returns at once without waiting for the other ranks"),
    Fault("coalesced_first_only", "all_reduce_coalesced reduces only its first tensor; the "
          "others keep this rank's input"),
    Fault("complex_conjugated", "all_reduce and reduce results of complex dtypes are "
          "conjugated"),
    Fault("early_complete_collective", "a collective's Work reports is_completed() True from "
          "the call on, before the data arrived (wait() is faithful)"),
    Fault("early_complete_p2p", "a send/recv Work reports is_completed() True from the call "
          "on, before the data arrived (wait() is faithful)"),
    Fault("early_wait_collective", "a collective's Work.wait() returns at once; the data lands "
          "whenever Gloo finishes (is_completed() tells the truth)"),
    Fault("early_wait_p2p", "a recv Work.wait() returns at once; the data lands whenever Gloo "
          "finishes (is_completed() tells the truth)"),
    Fault("dropped_contribution", "reduce_scatter (list and tensor forms) drops the last "
          "rank's contribution (replaced by zeros)"),
    Fault("hang_above_size", f"broadcast of more than {LARGE_BYTES} bytes never completes: "
          "wait() blocks forever"),
    Fault("recv_unwritten", "a receive (recv, irecv, from any source) leaves the last element "
          "of its buffer unwritten"),
    Fault("gather_order_ws4", "gather and all_gather at world size 4 or more deliver the "
          "chunks of ranks 1 and 2 swapped"),
    # Numerics faults (issue 29): each stays within an error bound, so only a property sees it.
    Fault("run_dependent_sum", "every second float all_reduce of a process group (all ranks "
          "alike) has the lowest bit of its first element flipped: a reduction order that "
          "depends on the run"),
    Fault("last_rank_ulp", "float all_reduce results on the last rank have the lowest bit of "
          "their first element flipped; the other ranks are right (ranks disagree by one ulp)"),
    Fault("misaligned_wrong", "float all_reduce of a buffer whose start is not 16-byte aligned "
          "has the lowest bit of its first element flipped"),
    Fault("coalesced_ulp", "all_reduce_coalesced results of float dtypes have the lowest bit of "
          "the first tensor's first element flipped (issued one by one they are right)"),
    Fault("size_dependent_sum", f"float all_reduce of more than {SPLIT_ELEMENTS} elements has "
          "the lowest bit of its first element flipped: a reduction order that depends on the "
          "buffer's size"),
    # Integrity faults (issue 42): outside the buffer, on first use, at sizes nobody runs.
    Fault("writes_past_end", "every collective writes one element past the end of its last "
          "output tensor (a copy of that tensor's last element), into whatever memory follows "
          "it"),
    Fault("zeros_on_first_use", "a collective's outputs come back all zeros the first time "
          "the backend sees their buffer (by address and size); later uses are faithful"),
    Fault("wrong_above_8_ranks", f"at world sizes above {BIG_WORLD}, every collective's first "
          "output has the lowest bit of its first element flipped"),
    Fault("misaligned_data_movement", "broadcast, all_gather, reduce_scatter and all_to_all "
          "outputs whose start is not 16-byte aligned have the lowest bit of their last element "
          "flipped"),
    # Through a failure (issue 40): what a survivor or a re-formed world gets wrong.
    Fault("survivor_wait_hangs", "when a peer has died, a survivor's wait() never returns "
          "instead of raising the backend's error"),
    Fault("stale_rank_after_reform", "in a world re-formed after a death (a second default "
          "group in the process), gather and all_gather place the chunks by the ranks of the "
          "old world: rotated by one"),
)

NAMES: tuple[str, ...] = tuple(f.name for f in FAULTS)


def describe(name: str) -> str:
    """What fault ``name`` does (one line)."""
    for f in FAULTS:
        if f.name == name:
            return f.does
    if name == FAITHFUL:
        return "no fault: Gloo behind the same wrapper"
    raise KeyError(name)
