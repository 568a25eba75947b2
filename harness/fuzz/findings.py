"""Findings become case files: the minimal instance, with how it was found and reproduced.

The file holds the generated case exactly as it ran (the executor loaded this same text), a
name that says the op and the outcome class, and a description with the seed, the
Hypothesis reproduction blob, the verdict's first line (and for a raise, which exception) and
the pytest command that runs it (``--backend NAME`` and every ``--backend-module``), so that
command fails the same way. Must not overwrite a file it did not write in this run: names are
made unique with a counter.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..report.jsonfile import printable
from .engine import AlsoFails, Finding


def case_name(f: Finding) -> str:
    """A case name from the signature: ``all_reduce_wrong_values``."""
    return re.sub(r"\W+", "_", f"{f.op}_{f.outcome}").strip("_")


def describe(f: Finding, backend: str, command: str, path: str = "",
             run_with: str = "") -> str:
    """The case's description: what was found (for a raise, which exception), how to run
    the file (``run_with``: the pytest options that reach the backend), the seed and the
    reproduction blob."""
    first = printable(f.message.splitlines()[0] if f.message else "", 300)
    blob = f.blob or "none (the example came from the example database)"
    raised = f" ({printable(f.exception, 300)})" if f.exception else ""
    parts = [f"collective-fuzz finding on backend {backend}: {f.outcome} in {f.op}{raised}.",
             f"Verdict: {first}",
             *([f"Run it: pytest {path} {run_with}."] if path and run_with else []),
             f"Found after {f.found_after_examples} generated instance(s) "
             f"({f.found_after_s:.1f} s); shrunk in {f.shrink_s:.1f} s.",
             f"Seed: {f.seed} (collective-fuzz {command} --seed {f.seed}).",
             f"Hypothesis reproduction blob: {blob}."]
    return " ".join(parts)


def write_case(f: Finding, out: Path, backend: str, command: str, taken: set[str],
               run_with: str = "") -> Path:
    """Write ``f`` as ``out/<name>.yaml``; returns the path. ``command``: the collective-fuzz
    options that find it again; ``run_with``: the pytest options that reach the backend."""
    base = case_name(f)
    name, k = base, 1
    while name in taken or (out / f"{name}.yaml").exists():
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    path = out / f"{name}.yaml"
    case = {"name": name, "description": describe(f, backend, command, str(path), run_with),
            **{k2: v for k2, v in f.case.items() if k2 != "name"}}
    text = ("# Written by collective-fuzz: a minimal generated instance that did not pass.\n"
            + yaml.safe_dump({"cases": [case]}, sort_keys=False, width=100))
    path.write_text(text)
    f.path = str(path)
    return path


def write_also(a: AlsoFails, out: Path, backend: str, confirm: str, taken: set[str]) -> Path:
    """Write an instance that is bad on the confirming backend too as
    ``out/also-fails/<name>.yaml`` (as generated, not shrunk); returns the path."""
    folder = out / "also-fails"
    folder.mkdir(exist_ok=True)
    base = re.sub(r"\W+", "_", a.signature).strip("_")
    name, k = base, 1
    while f"also/{name}" in taken or (folder / f"{name}.yaml").exists():
        k += 1
        name = f"{base}_{k}"
    taken.add(f"also/{name}")
    first = printable(a.message.splitlines()[0] if a.message else "", 300)
    other = printable(a.confirm_message.splitlines()[0] if a.confirm_message else "", 300)
    desc = (f"collective-fuzz: bad on backend {backend} ({first}) and on the confirming "
            f"backend {confirm} too ({a.confirm_outcome}: {other}), so not a finding of "
            "the backend under test.")
    case = {"name": name, "description": desc,
            **{k2: v for k2, v in a.case.items() if k2 != "name"}}
    path = folder / f"{name}.yaml"
    path.write_text("# Written by collective-fuzz: bad with and without the backend under "
                    "test's difference.\n"
                    + yaml.safe_dump({"cases": [case]}, sort_keys=False, width=100))
    a.path = str(path)
    return path
