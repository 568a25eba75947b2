"""Backends the harness provides for testing itself and others: the wrapping-backend base.

Takes: a real backend (``ProcessGroupGloo`` by default, any other through ``make_inner``) and a
subclass's hooks. :mod:`harness.backends.wrapping` holds
:class:`~harness.backends.wrapping.WrappingProcessGroup`, a Python ``ProcessGroup`` that
forwards every op of torch's ProcessGroup API to that backend through three hooks (prepare,
replace, finish).

Gives: a backend that can be registered like any third-party one. The mutation backend
(:mod:`harness.mutate.backend`) and the fault backends of the project's tests are thin
subclasses of it; a third-party backend author can subclass it the same way to inject faults
into their own backend.

Must not: change any call on its own (without hooks it is a faithful wrapper), or import
anything of the harness's pipeline: it runs inside rank processes of any user's program.
"""
