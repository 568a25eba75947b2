"""Suite strength: the mutation score of a case set against a family of injected faults.

Takes: case files or folders (and an optional ``-k`` selection), run through the pytest plugin
against :mod:`harness.mutate.backend`, Gloo behind a Python ProcessGroup registered as the
third-party backend ``mutant``, once faithful (``none``) and once per fault of
:mod:`harness.mutate.faults`.

Gives: per fault, ``killed`` (an instance that passed on the faithful wrapper does not pass
under the fault: the first such instance and its outcome are named) or ``survived`` (what the
fault does: a blind spot of the case set), the mutation score (killed / faults), printed and
as JSON (``--json``).

Must not: count an instance that does not pass on the faithful wrapper (a limitation of Gloo
or of the wrapper is not a kill); call a fault killed without naming the instance that
killed it; run anything but the plugin's own runner (one pytest session per fault).
"""
