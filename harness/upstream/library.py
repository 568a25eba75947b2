"""What the bundled case files hold, collected with the harness's own loader: every case's
description and the instance ids it expands to on Gloo and on NCCL."""

from __future__ import annotations

from pathlib import Path

from ..casefile import collect as casefile
from ..errors import CaseFileError, CaseFileErrors
from .table import Library, TableError

BACKENDS = ("gloo", "nccl")


def collect(case_dir: Path) -> Library:
    """The cases under ``case_dir`` (every ``*.yaml`` holding ``cases:``), expanded for each
    backend the table's rows name; TableError if a case file does not load."""
    descriptions: dict[tuple[str, str], str] = {}
    instances: dict[tuple[str, str], set[str]] = {}
    for path in sorted(case_dir.glob("*.yaml")):
        try:
            cases = casefile.cases_of_file(str(path), str(path))
            for case in cases:
                descriptions[(path.name, case.name)] = case.description
                instances.setdefault((path.name, case.name), set())
            for backend in BACKENDS:
                for inst in casefile.instances(cases, backend, str(path)):
                    instances[(path.name, inst.case)].add(inst.id)
        except (CaseFileError, CaseFileErrors) as exc:
            first = str(exc).splitlines()[0]
            raise TableError(f"{path}: the case file does not load: {first}") from None
    return Library(descriptions, {k: frozenset(v) for k, v in instances.items()})
