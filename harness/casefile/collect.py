"""The case-file stage's one face: a source in, its validated instances out, limits applied.

Every front end reads case files through here (the plugin's collection, the fuzzer's
generated documents and known library, external mode, the benchmarks, the docs generator):
load (with positions), validate (schema and semantics), expand every case (problems of all
cases reported together), and the operator's per-file and per-session instance limits. A
problem is a :class:`~harness.errors.CaseFileError` (or several, as
:class:`~harness.errors.CaseFileErrors`) with ``file:line:col``.
"""

from __future__ import annotations

from ..errors import CaseFileError, CaseFileErrors, Pos
from ..model import Case, Instance
from . import expand, load, validate
from .limits import Limits


def cases_of_file(path: str, display: str | None = None, limits: Limits | None = None
                  ) -> list[Case]:
    """The validated cases of the file at ``path`` (``display``: its name in messages)."""
    return validate.load_cases(load.load_file(path, display, limits))


def cases_of_text(text: str, file: str, limits: Limits | None = None,
                  generated: bool = False) -> list[Case]:
    """The validated cases of ``text`` (``generated``: a document the harness wrote itself,
    composed by libyaml; never for text someone else wrote)."""
    doc = (load.load_generated_text(text, file, limits) if generated
           else load.load_text(text, file, limits))
    return validate.load_cases(doc)


def instances(cases: list[Case], backend: str, file: str, limits: Limits | None = None, *,
              launched: int = expand.DEFAULT_LAUNCHED, already: int = 0) -> list[Instance]:
    """Every instance of ``cases`` (one file's) for ``backend``; the expansion problems of
    every case are raised together, then the per-file limit and the session's (``already``:
    instances the session collected before this file)."""
    lim = limits or Limits()
    out: list[Instance] = []
    problems: list[CaseFileError] = []
    for case in cases:
        try:
            out += expand.expand(case, backend, lim, len(out), launched=launched)
        except CaseFileError as exc:
            problems.append(exc)
        except CaseFileErrors as exc:
            problems += exc.errors
    if problems:
        raise CaseFileErrors(problems) if len(problems) > 1 else problems[0]
    if len(out) > lim.instances_per_file:
        raise CaseFileError(Pos(file, 1, 1), f"the file expands to {len(out)} instances; the "
                            f"limit is {lim.instances_per_file}",
                            hint="raise --max-instances-per-file / ini "
                            "collective_max_instances_per_file")
    if already + len(out) > lim.instances_per_session:
        raise CaseFileError(Pos(file, 1, 1), f"collecting its {len(out)} instances would "
                            f"exceed this session's limit of {lim.instances_per_session}",
                            hint="raise --max-instances / ini collective_max_instances")
    return out


def from_file(path: str, backend: str, display: str | None = None,
              limits: Limits | None = None, *, launched: int = expand.DEFAULT_LAUNCHED,
              already: int = 0) -> list[Instance]:
    """Load, validate and expand the case file at ``path``."""
    name = display or path
    return instances(cases_of_file(path, name, limits), backend, name, limits,
                     launched=launched, already=already)


def from_text(text: str, file: str, backend: str, limits: Limits | None = None, *,
              launched: int = expand.DEFAULT_LAUNCHED, generated: bool = False
              ) -> list[Instance]:
    """Load, validate and expand a case document given as text (``file``: its name)."""
    return instances(cases_of_text(text, file, limits, generated), backend, file, limits,
                     launched=launched)
