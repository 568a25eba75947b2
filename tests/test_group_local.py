"""Group-local addressing (group_src/group_dst/group_peer): validation, the call, skips."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist

from harness import ops
from harness.errors import CaseFileError, CaseFileErrors
from harness.ops.base import CallContext, root_kw
from harness.run.capabilities import Capabilities
from tests.helpers import case_instances as instances


def ctx(**args: Any) -> CallContext:
    return CallContext(dist=None, rank=3, world_size=4, group=None, group_ranks=(2, 3),
                       reduce_op=None, async_op=False, args=args)


def test_root_kw_passes_the_group_form_through() -> None:
    assert root_kw(ctx(src=3), "src") == {"src": 3}
    assert root_kw(ctx(src=3, group_src=1, addressing="group"), "src") == {"group_src": 1}
    assert root_kw(ctx(), "src") == {"src": None}  # recv from any source


SHORTHAND = """
cases:
  - name: b
    op: broadcast
    world_size: 4
    shape: [2]
    input: "rank"
    args: {group: [2, 3], group_src: 1}
"""


def test_shorthand_keeps_the_position_for_torch() -> None:
    (inst,) = instances(SHORTHAND)
    assert dict(inst.steps[0].args)["group_src"] == 1
    assert inst.id == "gloo-ws4-float32-sync-group2.3-group_src1"


@pytest.mark.parametrize(("args", "message"), [
    ("{src: 2, group_src: 1}", "give either 'src' (a global rank) or 'group_src'"),
    ("{group_dst: 1}", "broadcast takes no argument 'group_dst'"),
])
def test_bad_group_addressing_is_reported(args: str, message: str) -> None:
    text = SHORTHAND.replace("args: {group: [2, 3], group_src: 1}", f"args: {args}")
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(text)
    assert message in str(info.value) and "cases/x.yaml:" in str(info.value)


def test_p2p_entry_names_its_peer_once() -> None:
    text = """
cases:
  - name: p
    world_size: 2
    tensors:
      t: {shape: [2], init: 0}
    steps:
      - op: batch_isend_irecv
        p2p:
          - {op: isend, tensor: t, peer: 1, group_peer: 1}
        handle: h
      - {wait: h}
"""
    with pytest.raises((CaseFileError, CaseFileErrors)) as info:
        instances(text)
    assert "exactly one of 'peer'" in str(info.value)


def test_instances_skip_where_torch_lacks_the_parameter() -> None:
    (inst,) = instances(SHORTHAND)
    real = Capabilities.of_modules("x", 0, dist, SimpleNamespace(float32=1))
    if "group_src" in inspect.signature(dist.broadcast).parameters:
        assert real.skip_reason(inst) == ""
    else:  # torch 2.4.1 (observed): no group-local addressing yet
        assert real.skip_reason(inst) == ("torch x's broadcast has no group_src parameter "
                                          "(group-local addressing)")

    def broadcast(tensor: Any, src: int, group: Any = None, async_op: bool = False) -> None:
        raise AssertionError("not called")

    old = SimpleNamespace(broadcast=broadcast, is_backend_available=lambda b: True)
    caps = Capabilities.of_modules("1.0", 0, old, SimpleNamespace(float32=1))
    assert caps.skip_reason(inst) == ("torch 1.0's broadcast has no group_src parameter "
                                      "(group-local addressing)")
    assert ops.get("broadcast").args == ("src",)
