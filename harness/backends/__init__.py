"""Backends the harness provides for testing itself and others: the wrapping-backend base.

:mod:`harness.backends.wrapping` holds :class:`~harness.backends.wrapping.WrappingProcessGroup`,
a Python ``ProcessGroup`` that forwards every op of torch's ProcessGroup API to a real backend
(Gloo by default) through three hooks. The mutation backend (:mod:`harness.mutate.backend`) and
the fault backends of the project's tests are thin subclasses of it; a third-party backend
author can subclass it the same way to inject faults into their own backend.
"""
