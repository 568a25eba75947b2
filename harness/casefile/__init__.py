"""Stage 1, collection: case files in, :class:`~harness.model.Instance` records out.

Takes YAML files (``load``: positions for every node; ``validate``: the JSON Schema and the
checks a schema cannot express, with ``fields``/``opargs``/``groups`` for the shared and
op-specific pieces and ``stepkinds`` for each kind of program step), expands each
:class:`~harness.model.Case` into instances (``expand``, which also attaches the ordering
plan), and resolves overrides for the installed torch at run time (``overrides``).

Must not: import torch (collection runs in the pytest process, which must stay light), evaluate
anything but the whitelisted expressions of :mod:`harness.expr`, or run any case content.
Every problem is a :class:`~harness.errors.CaseFileError` with ``file:line:col``.
"""
