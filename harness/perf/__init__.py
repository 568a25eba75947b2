"""Performance mode (``--perf``): nccl-tests' bandwidth numbers from the conformance cases.

``plan`` (parent, collection and setup) reads the options and gives each timeable instance a
:class:`~harness.model.PerfPlan`; the ranks time the op on the checked buffers
(:mod:`harness.program.perf`); back in the parent, ``stats`` takes the maximum over ranks and
the median over repeats and turns times into ``algbw``/``busbw`` with the op table's bus
factors, and collects the facts that make numbers comparable (versions, devices, environment).

Must not: import torch (it runs in the pytest process), time anything in the parent, or attach
a bandwidth to an instance whose correctness verdict is not ``passed``.
"""
