"""``collective-gate --certificate CERT --require-level LEVEL``: the gate also requires a
backend's certificate (``collective-certify``) at a level, for the report's own backend.

A certificate is read like any input of the gate (a regular JSON file of bounded size, one
line on anything wrong); one for another backend than the report's is unusable, never a pass.
"""

from __future__ import annotations

from typing import Any

from ..certify.cells import LEVELS
from ..report.jsonfile import UnreadableFile, printable, read_json
from .baseline import BaselineError


def check(path: str, required: str, report_backends: list[str]) -> tuple[bool, str]:
    """(whether the certificate at ``path`` meets ``required``, one line saying so).
    BaselineError when it cannot be used."""
    try:
        cert: Any = read_json(path, "certificate")
    except UnreadableFile as exc:
        raise BaselineError(str(exc)) from None
    level = cert.get("level") if isinstance(cert, dict) else None
    backend = cert.get("backend") if isinstance(cert, dict) else None
    if level not in LEVELS or not isinstance(backend, str):
        raise BaselineError(f"{path}: not a certificate written by collective-certify (no "
                            "level or backend)")
    if report_backends and backend not in report_backends:
        raise BaselineError(f"{path}: a certificate for {printable(backend, 80)}, but the "
                            f"report is for {', '.join(report_backends)}")
    ok = LEVELS.index(level) >= LEVELS.index(required)
    why = cert.get("why") or []
    first = f": {printable(str(why[0]), 200)}" if why and not ok else ""
    return ok, (f"collective-gate: certificate of {backend}: level {level}, required "
                f"{required}: {'PASS' if ok else 'FAIL'}{first}\n")
