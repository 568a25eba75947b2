"""Point-to-point matching: every receive has its send on the peer, seen before any rank runs.

A ``recv`` whose peer never sends blocks its rank until the instance's deadline, and the hang
then names the case, not the step. Where the messages of a program are static (every send and
receive names its peer by a number or an expression over ``rank``, ``world_size``, params and
``rep``, in the world or in a group given as a list of ranks), :func:`check` counts them per
(sender, receiver, tag, kind) at collection and reports the first unmatched one at its step's
``file:line:col``. A program whose messages are not static (a receive from any source, a group
made by a ``new_group`` step, a CUDA graph capture) is not checked here; its hang names the
step and the peer instead (:func:`peer_of`, used by :mod:`harness.verdict.outcome`).

A case that declares a hang, an error or a crash (at the case, in an override or at a step),
or plans a death, is not checked: an unmatched message may be what it documents.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..expr import Expr
from ..model import Case, Step

# op -> (direction, the argument naming the peer, what the message carries)
P2P_OPS = {"send": ("send", "dst", "tensor"), "isend": ("send", "dst", "tensor"),
           "recv": ("recv", "src", "tensor"), "irecv": ("recv", "src", "tensor"),
           "send_object_list": ("send", "dst", "objects"),
           "recv_object_list": ("recv", "src", "objects")}
BATCH = "batch_isend_irecv"
FAULTS = ("abort", "exit", "segfault", "kill", "stall", "raise", "reform", "shrink",
          "abort_group")
# (direction, this rank, the peer, tag, what it carries)
Message = tuple[str, int, int, int, str]


class NotStatic(Exception):
    """The step's messages depend on something known only while the program runs."""


def _value(v: Any, env: dict[str, Any]) -> Any:
    return v(env) if isinstance(v, Expr) else v


def _peer(args: dict[str, Any], key: str, by_group: bool, env: dict[str, Any]) -> int:
    """The global rank ``args[key]`` names (a position in a list group with ``by_group``).
    A peer torch rejects (any source, this rank, out of the world or group) is not static:
    the run says what torch does with it."""
    peer = _value(args.get(key), env)
    if type(peer) is not int:
        raise NotStatic(key)
    if by_group:
        group = args.get("group")
        if not isinstance(group, tuple) or not 0 <= peer < len(group):
            raise NotStatic("group")
        peer = int(sorted(group)[peer])
    if peer == env["rank"] or not 0 <= peer < env["world_size"]:
        raise NotStatic(key)
    return peer


def step_messages(step: Step, rank: int, ws: int, env: dict[str, Any]) -> list[Message]:
    """The messages ``step`` sends and receives on ``rank`` (none where it does not run
    there); NotStatic where they cannot be known before the program runs."""
    if step.kind == "capture" and any(s.op in P2P_OPS or s.op == BATCH for s in step.steps):
        raise NotStatic("capture")
    if step.kind != "op" or (step.op not in P2P_OPS and step.op != BATCH):
        return []
    env = {**env, "rank": rank, "world_size": ws}
    try:
        if not step.runs_on(rank, ws, env):
            return []
        args = dict(step.args)
        if isinstance(args.get("group"), str):
            raise NotStatic("group")
        out: list[Message] = []
        for rep in range(step.repeat):
            renv = {**env, "rep": rep}
            if step.op == BATCH:
                for k in sorted({int(name.split(".")[1]) for name in args
                                 if name.startswith("p2p.")}):
                    way = "send" if args[f"p2p.{k}.op"] == "isend" else "recv"
                    peer = _peer(args, f"p2p.{k}.peer", bool(args.get(f"p2p.{k}.by_group")),
                                 renv)
                    out.append((way, rank, peer, int(args.get(f"p2p.{k}.tag", 0)), "tensor"))
                continue
            way, key, carries = P2P_OPS[str(step.op)]
            if key in args.get("omit", ()):
                raise NotStatic(key)
            by_group = f"group_{key}" in args
            peer = _peer(args, f"group_{key}" if by_group else key, by_group, renv)
            tag = _value(args.get("tag", 0), renv)
            out.append((way, rank, peer, tag if type(tag) is int else 0, carries))
        return out
    except NotStatic:
        raise
    except Exception:  # an expression that fails here fails on the rank too: not ours
        raise NotStatic("expression") from None


def _exempt(case: Case, steps: tuple[Step, ...]) -> bool:
    """Whether the case may leave a message unmatched on purpose."""
    raw = case.raw
    if any(k in raw for k in ("hangs", "crashes", "raises")):
        return True
    if any(k in o for o in raw.get("overrides", ()) if isinstance(o, dict)
           for k in ("hangs", "crashes", "raises")):
        return True
    return any(s.raises is not None or s.kind in FAULTS for s in steps)


def check(case: Case, steps: tuple[Step, ...], ws: int, env: dict[str, Any]) -> None:
    """CaseFileError at the first receive (or send) of a program that its peer does not
    match, at world size ``ws``; nothing where the messages are not static."""
    if _exempt(case, steps):
        return
    where: dict[tuple[str, int, int, int, str], int] = {}  # first step of each message
    count: Counter[tuple[str, int, int, int, str]] = Counter()
    try:
        for idx, step in enumerate(steps):
            for rank in range(ws):
                for msg in step_messages(step, rank, ws, env):
                    way, me, peer, tag, carries = msg
                    # keyed by (direction, sender, receiver, tag, kind)
                    key = (way, me, peer, tag, carries) if way == "send" else (
                        way, peer, me, tag, carries)
                    count[key] += 1
                    where.setdefault(key, idx)
    except NotStatic:
        return
    for key in sorted(where, key=lambda k: (where[k], k[0] != "recv")):
        way, sender, receiver, tag, carries = key
        other = ("send" if way == "recv" else "recv", sender, receiver, tag, carries)
        if count[key] <= count[other]:
            continue
        n, m = count[key], count[other]
        objects = carries == "objects"
        if way == "recv":
            raise case.error(("steps", where[key]), (
                f"no matching send for this receive at world size {ws}: rank {receiver} "
                f"receives from rank {sender} (tag {tag}) {n} time(s), rank {sender} sends "
                f"to rank {receiver} with that tag {m} time(s); rank {receiver} would block "
                "until the deadline"),
                f"add the {'send_object_list' if objects else 'send'} on rank {sender} (dst "
                f"{receiver}, tag {tag}), or declare the hang with 'hangs: true'")
        raise case.error(("steps", where[key]), (
            f"no matching receive for this send at world size {ws}: rank {sender} sends to "
            f"rank {receiver} (tag {tag}) {n} time(s), rank {receiver} receives from rank "
            f"{sender} with that tag {m} time(s); rank {sender} may block until the deadline"),
            f"add the {'recv_object_list' if objects else 'recv'} on rank {receiver} (src "
            f"{sender}, tag {tag}), or declare the hang with 'hangs: true'")


def peer_of(step: Step, rank: int, ws: int, env: dict[str, Any]) -> tuple[str, int] | None:
    """(``"send to"``/``"receive from"``, the peer) of a blocking point-to-point ``step`` on
    ``rank`` where it is a single message; None otherwise."""
    try:
        msgs = step_messages(step, rank, ws, env)
    except NotStatic:
        return None
    if len({(way, peer) for way, _, peer, _, _ in msgs}) != 1:
        return None
    way, _, peer, _, _ = msgs[0]
    return ("send to" if way == "send" else "receive from"), peer
