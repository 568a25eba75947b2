"""Whom a rank blocked in a point-to-point step waits for, for a hang's message.

A ``recv`` with no matching send is caught at collection where the program's messages are
static (:mod:`harness.casefile.p2pmatch`); where they are not (a receive from any source, a
group made at run time, sends and receives that match in number but not in order), the hang
is seen at the deadline. Its message then says, for each blocked rank in a send or receive,
the peer it waits for and what that peer was doing, and points at the step's line.
"""

from __future__ import annotations

from ..casefile.p2pmatch import BATCH, P2P_OPS, peer_of
from ..model import Instance, RankState


def _doing(st: RankState | None) -> str:
    if st is None:
        return "whose state is not known"
    if st.state == "blocked":
        return (f"which is blocked in step {st.step} ({st.step_desc})" if st.step >= 0
                else "which is blocked")
    return {"finished": "which finished", "raised": "which raised",
            "died": "which died", "killed": "which was killed"}[st.state]


def waiting(inst: Instance, st: RankState, states: list[RankState]) -> str:
    """``waits (line 9) to receive from rank 0, which finished`` for a rank blocked in a
    point-to-point step ("" for any other rank)."""
    if st.state != "blocked" or not 0 <= st.step < len(inst.steps):
        return ""
    step = inst.steps[st.step]
    if step.kind != "op" or (step.op not in P2P_OPS and step.op != BATCH):
        return ""
    found = peer_of(step, st.rank, inst.world_size, dict(inst.params))
    if found is None:
        args = dict(step.args)
        if step.op in P2P_OPS and P2P_OPS[step.op][0] == "recv" and not (
                {"src", "group_src"} & set(args)):
            return f"waits (line {step.line}) to receive from any rank"
        return ""
    way, peer = found
    by_rank = {s.rank: s for s in states}
    return f"waits (line {step.line}) to {way} rank {peer}, {_doing(by_rank.get(peer))}"


def first_waiting(inst: Instance, states: list[RankState]) -> tuple[int | None, str]:
    """The line of the first blocked rank's point-to-point step, and ``rank 1 waits ...``
    (None and "" when no blocked rank is in one)."""
    for st in sorted(states, key=lambda s: s.rank):
        text = waiting(inst, st, states)
        if text:
            return inst.steps[st.step].line, f"rank {st.rank} {text}"
    return None, ""
