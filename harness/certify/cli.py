"""The ``collective-certify`` command (also ``python -m harness.certify``).

    collective-certify --manifest my-backend.yaml            # the bundled library, cases/
    collective-certify --manifest m.yaml --cases my_cases/ --out reports/certificate
    collective-certify --backend-module mybackend --backend mybackend   # no manifest: probed
    collective-certify --manifest m.yaml --reference reports/reference/gloo-cpu.json
    collective-certify --rebuild reports/reference/torchft-gloo-certificate   # no sessions

Runs, each as an ordinary pytest session of the harness (so every verdict is the one the
reports give): the identity probes, then (without a manifest) the probes that propose one,
then the library with the manifest and ``--after-hang skip``, then the library on the
reference backend unless a reference report is given; writes ``certificate.json`` and
``certificate.md`` into ``--out`` with the sessions' reports beside them. ``--rebuild DIR``
runs nothing: it writes the certificate again from the sessions' reports already in DIR (the
committed certificates are rebuilt so, and a test finds them equal to what their reports make).

Exit status: 0 when the level is at least ``--require`` (default ``declared``), 1 when it is
not, 2 for unusable input (one line saying why).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..casefile.load import load_text
from ..errors import CaseFileError
from ..manifest.load import error_line, parse, read
from ..report.jsonfile import UnreadableFile, printable
from ..report.records import load_report, write_atomic
from . import cells, propose, render

PROG = "collective-certify"
# The one line of each breaker that tripped: harness.runner.breaker's, harness.runner.starts's.
TRIPPED = ("collective-harness: --after-hang skip:", "collective-harness: pool start:")


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise argparse.ArgumentTypeError(f"{text!r}: a share from 0 to 1 (0.05 is 5%)")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(prog=PROG, description="Certify a torch.distributed backend "
                                 "against the case library and its capability manifest.")
    ap.add_argument("--manifest", metavar="FILE", help="the backend's capability manifest")
    ap.add_argument("--backend", metavar="NAME", help="the backend (taken from the manifest "
                    "when one is given)")
    ap.add_argument("--backend-module", action="append", default=[], metavar="MOD",
                    help="import MOD before the process group starts (repeatable)")
    ap.add_argument("--cases", action="append", default=[], metavar="PATH",
                    help="the case library (default: cases/ here)")
    ap.add_argument("--out", default="reports/certificate", metavar="DIR",
                    help="where the certificate and the sessions' reports go")
    ap.add_argument("--reference", metavar="REPORT", help="a conformance report of the "
                    "reference backend on the same library (default: run it)")
    ap.add_argument("--reference-backend", default="gloo", metavar="NAME",
                    help="the reference backend run when no --reference is given (gloo)")
    ap.add_argument("--no-reference", action="store_true",
                    help="no comparison with a reference backend")
    ap.add_argument("--skip-budget", type=_budget, default=cells.DEFAULT_SKIP_BUDGET,
                    metavar="SHARE", help="the share of instances that may be skipped for a "
                    "reason other than a declaration (default 0.05)")
    ap.add_argument("--deadline", type=float, default=20.0, metavar="SECONDS",
                    help="per-instance deadline of the library session (default 20)")
    ap.add_argument("--require", choices=cells.LEVELS, default="declared",
                    help="the level below which the exit status is 1 (default declared)")
    ap.add_argument("--full", action="store_true", help="the long matrix too")
    ap.add_argument("--rebuild", metavar="DIR", help="run nothing: write DIR's certificate "
                    "again from the identity, library and reference reports in DIR")
    ap.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sessions and write the certificate; the exit status as documented above."""
    args = parser().parse_args(argv)
    if args.rebuild:
        return _rebuild(args)
    try:
        manifest = read(args.manifest) if args.manifest else None
    except CaseFileError as exc:
        print(f"{PROG}: error: --manifest: {error_line(exc)}", file=sys.stderr)
        return 2
    backend = manifest.backend if manifest else args.backend
    if not backend:
        print(f"{PROG}: error: give --manifest FILE (or --backend NAME to have one proposed)",
              file=sys.stderr)
        return 2
    if manifest and args.backend and args.backend != manifest.backend:
        print(f"{PROG}: error: --backend {printable(args.backend, 80)} is not the manifest's "
              f"backend {manifest.backend!r}", file=sys.stderr)
        return 2
    cases = args.cases or ["cases"]
    for path in cases:
        if not os.path.exists(path):
            print(f"{PROG}: error: --cases {printable(path, 200)}: no such file or folder",
                  file=sys.stderr)
            return 2
    modules = list(args.backend_module)
    if manifest and manifest.module and manifest.module not in modules:
        modules.append(manifest.module)
    os.makedirs(args.out, exist_ok=True)
    base = [f"--backend={backend}", *(f"--backend-module={m}" for m in modules)]
    identity = _session("identity", [_data("identity.yaml")], base, args)
    proposed = False
    manifest_path = args.manifest
    if manifest is None:
        probes = _session("probes", [_data("probes.yaml")], base, args)
        text = propose.manifest_text(backend, modules, probes,
                                     propose.probe_ops(_data("probes.yaml")))
        manifest_path = os.path.join(args.out, "manifest.proposed.yaml")
        write_atomic(manifest_path, text)
        manifest = parse(load_text(text, manifest_path))
        proposed = True
        print(f"{PROG}: no manifest given; proposed {manifest_path} from the probes")
    library = _session("library", cases, [f"--manifest={manifest_path}",
                                          *(f"--backend-module={m}" for m in args.backend_module),
                                          "--after-hang=skip",
                                          f"--deadline={args.deadline}",
                                          *(["--full"] if args.full else [])], args)
    reference = None
    if args.reference:
        try:
            reference = load_report(args.reference)
        except UnreadableFile as exc:
            print(f"{PROG}: error: --reference: {exc}", file=sys.stderr)
            return 2
    elif not args.no_reference:
        # A manifest that claims everything: the reference's records are filed by the same
        # needs as the backend's, so their cells line up.
        ref_manifest = os.path.join(args.out, "reference.manifest.yaml")
        write_atomic(ref_manifest, f"backend: {args.reference_backend}\n")
        reference = _session("reference", cases, [f"--manifest={ref_manifest}",
                                                  f"--deadline={args.deadline}",
                                                  *(["--full"] if args.full else [])], args)
    if library is None:
        print(f"{PROG}: error: the library session wrote no report (see its output above)",
              file=sys.stderr)
        return 2
    cert = cells.certificate(identity, library, reference, args.skip_budget, proposed)
    return _write(cert, args.out, args.require)


def _write(cert: dict[str, Any], out: str, require: str) -> int:
    write_atomic(os.path.join(out, "certificate.json"), json.dumps(cert, indent=1) + "\n")
    write_atomic(os.path.join(out, "certificate.md"), render.markdown(cert))
    print(render.summary_line(cert))
    print(f"{PROG}: certificate written to {os.path.join(out, 'certificate.md')} and "
          "certificate.json")
    return 0 if cells.meets(cert, require) else 1


def from_folder(folder: str, budget: float) -> dict[str, Any]:
    """The certificate that the session reports in ``folder`` (``identity``, ``library`` and,
    when there, ``reference``; ``.json`` or ``.json.gz``) make under the skip ``budget``;
    proposed when the folder holds the proposed manifest. :class:`UnreadableFile` when a
    report is unreadable or the library's is missing."""
    library = _folder_report(folder, "library")
    if library is None:
        raise UnreadableFile(f"{printable(folder, 200)}: no library.json or library.json.gz "
                             "in it (the folder collective-certify --out wrote)")
    proposed = os.path.exists(os.path.join(folder, "manifest.proposed.yaml"))
    return cells.certificate(_folder_report(folder, "identity"), library,
                             _folder_report(folder, "reference"), budget, proposed)


def _folder_report(folder: str, name: str) -> dict[str, Any] | None:
    for path in (os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}.json.gz")):
        if os.path.exists(path):
            return load_report(path)
    return None


def _rebuild(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.rebuild):
        print(f"{PROG}: error: --rebuild {printable(args.rebuild, 200)}: no such folder",
              file=sys.stderr)
        return 2
    try:
        cert = from_folder(args.rebuild, args.skip_budget)
    except UnreadableFile as exc:
        print(f"{PROG}: error: --rebuild: {exc}", file=sys.stderr)
        return 2
    return _write(cert, args.rebuild, args.require)


def _data(name: str) -> str:
    return str(resources.files("harness.certify").joinpath("data", name))


def _session(name: str, paths: list[str], extra: list[str],
             args: argparse.Namespace) -> dict[str, Any] | None:
    """Run one pytest session of the harness; its JSON report (None if it wrote none)."""
    out = os.path.join(args.out, name)
    report = f"{out}.json"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(report)  # never read an older session's report as this one's
    cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider",
           "--rootdir", os.getcwd(), f"--report-json={report}", f"--report-md={out}.md",
           f"--report-html={out}.html", *extra, *args.pytest_args]
    print(f"{PROG}: {name}: {' '.join(cmd[1:])}", flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", check=False)
    for line in worth_repeating(done.stdout):
        print(f"  {line}")
    return _read(report)


def worth_repeating(output: str) -> list[str]:
    """Of a session's output, the lines this command repeats: each line saying a breaker
    stopped sending something (an op that hung, a pool that would not start), then the
    verdict's first two lines (not the progress notes)."""
    said = [ln for ln in output.splitlines() if ln.startswith("collective-harness:")
            and ": waiting " not in ln]
    tripped = [ln for ln in said if ln.startswith(TRIPPED)]
    return tripped + [ln for ln in said if not ln.startswith(TRIPPED)][:2]


def _read(path: str) -> dict[str, Any] | None:
    """A report this command's own session just wrote (None when it wrote none)."""
    try:
        return load_report(path)
    except UnreadableFile:
        return None
