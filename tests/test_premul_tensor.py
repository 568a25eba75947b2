"""``premul_tensor``: the PREMUL_SUM factor built as a tensor of the buffers' dtype/device."""

from __future__ import annotations

import textwrap

import torch

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.program import stepchecks


def test_premul_tensor_reaches_the_instance_and_the_reduce_op() -> None:
    text = textwrap.dedent("""
    cases:
      - name: p
        op: all_reduce
        world_size: 2
        reduce_op: premul_sum
        args: {premul_factor: 5.0, premul_tensor: true}
        shape: [3]
        input: "i"
    """)
    (case,) = validate.load_cases(yamlload.load_text(text, "cases/x.yaml"))
    (inst,) = expand.expand(case, "gloo")
    assert inst.premul_tensor and inst.premul_factor == 5.0
    buf = torch.zeros(3, dtype=torch.float16)
    assert stepchecks.factor_like(inst, {"tensor": buf}) is buf
