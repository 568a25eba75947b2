"""Helpers shared by the plugin and pool tests."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema

from harness.report.records import report_schema

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def load_report(path: Path) -> dict[str, Any]:
    """Read a JSON report and check it against the shipped schema."""
    report = json.loads(path.read_text())
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    return dict(report)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child pytest that can import tests/fault_backend.py."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def rank_pids(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``marker`` and that are ranks."""
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().split(") ", 1)[1][0]
        except OSError:
            continue
        if comm.startswith("coll-rank") and state != "Z":
            pids.append(int(entry))
    return pids


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


PYTHON = sys.executable


def case_instances(text: str, backend: str = "gloo") -> list[Any]:
    """Load, validate and expand the case file ``text`` (dedented) as ``cases/x.yaml``."""
    import textwrap

    from harness.casefile import expand, validate
    from harness.casefile import load as yamlload

    doc = yamlload.load_text(textwrap.dedent(text), "cases/x.yaml")
    return [i for c in validate.load_cases(doc) for i in expand.expand(c, backend)]


def case_error(text: str, backend: str = "gloo") -> str:
    """The rendered collection error of the case file ``text``; fails the test if none."""
    from harness.errors import CaseFileError, CaseFileErrors

    try:
        case_instances(text, backend)
    except (CaseFileError, CaseFileErrors) as exc:
        return str(exc)
    raise AssertionError("the case file was accepted; an error was expected")
