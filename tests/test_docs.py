"""The docs are true (issue 27): every example runs, every README section has a home.

Every ```yaml fence in README.md and docs/**/*.md carries a marker, an HTML comment on the line
before it, and is checked accordingly:

- ``<!-- case: passes -->``: a case file (or a list of cases, wrapped under ``cases:``) whose
  instances all pass on Gloo (limitations and declared xfails count as meeting the contract);
- ``<!-- case: fails "TEXT" -->``: some instance fails with TEXT in its message;
- ``<!-- case: error L:C "TEXT" -->``: collection fails at line L, column C with TEXT;
- ``<!-- excerpt: FILE::CASE -->``: a piece of a bundled case, which must be contained in it
  (the bundled library is run by tests/test_library.py and test_cookbook.py);
- ``<!-- fragment -->``: part of a case that is not one (kept rare).
- ``<!-- manifest -->``: a capability manifest (``--manifest``), which the manifest loader
  must accept as it stands.

``file=NAME`` after a case marker also writes the snippet as NAME for the page's commands.
Every ```console fence (commands shown with their output) is marked ``<!-- run -->`` (run in
order, per page, in one folder; each line shown must appear in order in the real output, with
``...`` standing for any lines and durations ignored) or ``<!-- needs: gpu -->`` /
``<!-- needs: cluster -->`` / ``<!-- needs: hours -->`` (a recorded measurement longer than the
test budget, which says where and when it was taken).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.docsgen.reference import render_all
from tests.helpers import HANG_S

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(
    r"^<!-- (case: (passes|fails|error)|excerpt:|fragment|manifest|run|needs:)(.*?)-->$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str  # the comment's text, "" when unmarked
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def option(self, name: str) -> str | None:
        m = re.search(rf"\b{name}=(\S+)", self.marker)
        return m.group(1) if m else None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page with the marker comment right before each."""
    lines = page.read_text("utf-8").split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        prev = lines[i - 1].strip() if i else ""
        marker = prev if MARKER.match(prev) else ""
        out.append(Block(page, i + 1, m.group(1), marker, "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return out


ALL = [b for p in PAGES for b in blocks(p)]


def kind(b: Block) -> str:
    m = MARKER.match(b.marker)
    return "" if m is None else (m.group(2) or m.group(1).rstrip(":"))


def quoted(b: Block) -> str:
    m = re.search(r'"([^"]*)"', b.marker)
    assert m, f"{b.where}: the marker needs a quoted message"
    return m.group(1)


def as_case_file(b: Block) -> str:
    """The snippet as a case file: a bare list of cases goes under ``cases:``."""
    text = b.text
    if re.match(r"^\s*- ", text):
        indent = len(text) - len(text.lstrip(" "))
        text = "cases:\n" + "\n".join("  " + ln[indent:] if ln.strip() else ""
                                      for ln in text.split("\n"))
    return text


# -- the README and the site -----------------------------------------------------------------

def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text("utf-8").splitlines()) <= 200


# Every section of the README before issue 27 (git show 25ac40d:README.md), and where it went.
MOVED = {
    "Two commands": ("howto/install.md", "two-commands"),
    "Requirements": ("howto/install.md", "requirements"),
    "Running": ("reference/running.md", "running"),
    "Which files are case files": ("reference/running.md", "which-files-are-case-files"),
    "Limits": ("reference/limits.md", ""),
    "Third-party backends": ("howto/third-party-backend.md", ""),
    "Writing a case": ("reference/case-format.md", "writing-a-case"),
    "Keys of a case": ("reference/case-format.md", "keys-of-a-case"),
    "Fills: how a buffer is filled or what it must hold":
        ("reference/case-format.md", "fills-how-a-buffer-is-filled-or-what-it-must-hold"),
    "Tolerances": ("reference/case-format.md", "tolerances"),
    "Uneven lists: entries of different shapes":
        ("reference/case-format.md", "uneven-lists-entries-of-different-shapes"),
    "Sparse buffers": ("reference/case-format.md", "sparse-buffers"),
    "Programs: several steps per rank":
        ("reference/programs.md", "programs-several-steps-per-rank"),
    "Ordering steps: delays, slow producers, snapshots":
        ("howto/async-ordering.md", "ordering-steps-delays-slow-producers-snapshots"),
    "CUDA steps: graph capture and replay, streams":
        ("howto/async-ordering.md", "cuda-steps-graph-capture-and-replay-streams"),
    "Group-local addressing": ("reference/programs.md", "group-local-addressing"),
    "Groups made by the program": ("reference/programs.md", "groups-made-by-the-program"),
    "Omitted arguments: testing torch's defaults":
        ("reference/case-format.md", "omitted-arguments-testing-torchs-defaults"),
    "Torch modes": ("reference/case-format.md", "torch-modes"),
    "Per-case environment and process-group timeout":
        ("reference/environment.md", "per-case-environment-and-process-group-timeout"),
    "Timeouts, step errors and group lifecycle":
        ("reference/environment.md", "timeouts-step-errors-and-group-lifecycle"),
    "Overrides: when a backend differs from the contract":
        ("reference/expectations.md", "overrides-when-a-backend-differs-from-the-contract"),
    "Expected failures: every rank is accounted for":
        ("reference/expectations.md", "expected-failures-every-rank-is-accounted-for"),
    "Errors in case files": ("reference/expectations.md", "errors-in-case-files"),
    "Ops": ("reference/ops.md", "ops"),
    "Process-group methods": ("reference/ops.md", "process-group-methods"),
    "The bundled library": ("reference/library.md", ""),
    "Suite strength (mutation score)": ("howto/mutation-score.md", ""),
    "Outcomes": ("explanation/outcomes.md", "outcomes"),
    "Ordering checks (the async contract)": ("explanation/async-contract.md", ""),
    "Reports": ("reference/reports.md", "reports"),
    "Verdict, headline and incomplete sessions":
        ("explanation/outcomes.md", "verdict-headline-and-incomplete-sessions"),
    "Markdown report": ("reference/reports.md", "markdown-report"),
    "HTML report": ("reference/reports.md", "html-report"),
    "JUnit XML": ("reference/reports.md", "junit-xml"),
    "Torch versions": ("howto/torch-versions.md", ""),
    "Gating in CI": ("howto/ci-gate.md", "gating-in-ci"),
    "Running untrusted cases": ("howto/ci-gate.md", "running-untrusted-cases"),
    "Bandwidth (perf mode)": ("howto/bandwidth.md", ""),
    "Architecture": ("explanation/architecture.md", ""),
    "How it runs": ("explanation/process-model.md", "how-it-runs"),
    "Performance": ("explanation/process-model.md", "performance"),
    "Beyond one machine": ("howto/multi-node.md", ""),
}


def slugify(title: str, sep: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's toc slugify, ASCII titles)."""
    text = re.sub(r"[^\w\s-]", "", title).strip().lower()
    return re.sub(rf"[{sep}\s]+", sep, text)


def headings(page: Path) -> set[str]:
    fence = False
    out = set()
    for line in page.read_text("utf-8").split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(slugify(line.lstrip("#").strip(), "-"))
    return out


@pytest.mark.parametrize("section", sorted(MOVED))
def test_every_old_readme_section_has_a_home(section: str) -> None:
    page, anchor = MOVED[section]
    path = ROOT / "docs" / page
    assert path.is_file(), f"README section {section!r} was moved to docs/{page}, which is gone"
    if anchor:
        assert anchor in headings(path), f"docs/{page} has no heading #{anchor} ({section!r})"


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    for page in (ROOT / "docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert re.search(rf"^\s+- [^#\n]*: {re.escape(rel)}$", nav, re.M), rel


def test_the_folder_maps_name_every_file() -> None:
    """tests/README.md names every Python file of tests/, ci/README.md every file of ci/."""
    tests_map = (ROOT / "tests" / "README.md").read_text("utf-8")
    unnamed = [p.name for p in sorted((ROOT / "tests").glob("*.py"))
               if p.name != "__init__.py" and f"`{p.name}`" not in tests_map]
    ci_map = (ROOT / "ci" / "README.md").read_text("utf-8")
    for p in sorted((ROOT / "ci").rglob("*")):
        rel = p.relative_to(ROOT / "ci")
        if (p.is_file() and p.name != "README.md" and "__pycache__" not in rel.parts
                and rel.parts[0] != "baselines"):
            named = f"`{p.name}" in ci_map
            unnamed += [] if named else [f"ci/{rel.as_posix()}"]
    assert unnamed == []


def test_generated_reference_is_current() -> None:
    for name, text in render_all().items():
        path = ROOT / "docs" / "reference" / "generated" / name
        assert path.read_text("utf-8") == text, (
            f"{path.relative_to(ROOT)} is not current: run python ci/docs/gen_reference.py")


def test_generated_reference_covers_every_op_and_option() -> None:
    from harness.ops import ALL_OPS
    table = (ROOT / "docs/reference/generated/op-table.md").read_text("utf-8")
    assert all(f"| `{name}` |" in table for name in ALL_OPS)
    options = (ROOT / "docs/reference/generated/options.md").read_text("utf-8")
    for flag in ("--backend", "--deadline", "--max-sleep", "--perf-repeats", "--ordering"):
        assert f"`{flag}`" in options, flag


# -- every example runs -----------------------------------------------------------------------

def test_every_example_is_marked() -> None:
    unmarked = [b.where for b in ALL if b.lang == "yaml" and not b.marker]
    unmarked += [b.where for b in ALL if (b.lang == "console" or b.text.startswith("$ "))
                 and kind(b) not in ("run", "needs")]
    assert not unmarked, "examples without a marker (see tests/test_docs.py): " + ", ".join(
        unmarked)
    for b in ALL:
        if kind(b) == "needs":
            assert b.marker.split("needs:")[1].split()[0] in ("gpu", "cluster", "hours"), b.where


def contained(part: Any, whole: Any) -> bool:
    """``part`` is ``whole`` with keys and list items left out (a list: items in order)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and contained(v, whole[k]) for k, v in part.items())
    if isinstance(part, list):
        if not isinstance(whole, list):
            return False
        it = iter(whole)
        return all(any(contained(p, w) for w in it) for p in part)
    return bool(part == whole) and type(part) is type(whole)


@pytest.mark.parametrize("block", [b for b in ALL if kind(b) == "excerpt"],
                         ids=lambda b: b.where)
def test_excerpt_is_from_its_bundled_case(block: Block) -> None:
    """``excerpt: FILE::CASE`` is a piece of that case; ``excerpt: FILE`` lists whole cases."""
    ref = block.marker.split("excerpt:")[1].replace("-->", "").strip()
    file, _, name = ref.partition("::")
    data = yaml.safe_load((ROOT / file).read_text("utf-8"))
    defaults = data.get("defaults", {})
    cases = {c["name"]: {**defaults, **c} for c in data["cases"]}
    part = yaml.safe_load(block.text)
    if not name:
        assert isinstance(part, list), f"{block.where}: name the case (excerpt: FILE::CASE)"
        for item in part:
            assert contained(item, cases.get(item.get("name"))), (
                f"{block.where}: {item.get('name')!r} is not a piece of {file}")
        return
    assert name in cases, f"{block.where}: {file} has no case {name!r}"
    if isinstance(part, list):
        part = part[0] if len(part) == 1 and "name" in part[0] else {"steps": part}
    assert contained(part, cases[name]), f"{block.where}: not a piece of {ref}"


@pytest.mark.parametrize("block", [b for b in ALL if kind(b) == "manifest"],
                         ids=lambda b: b.where)
def test_a_manifest_example_is_one_the_loader_accepts(block: Block) -> None:
    from harness.casefile.load import load_text
    from harness.errors import CaseFileError
    from harness.manifest.load import error_line, parse

    try:  # blank lines before it, so that an error names the page's own line
        parse(load_text("\n" * block.line + block.text, str(block.page.relative_to(ROOT))))
    except CaseFileError as exc:
        pytest.fail(f"the manifest example is refused: {error_line(exc)}")


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=HANG_S,
                          check=False)


def test_case_snippets_have_their_outcome(tmp_path: Path) -> None:
    """Every passes/fails snippet runs in one Gloo session; every error one is collected."""
    runs = [b for b in ALL if kind(b) in ("passes", "fails")]
    errors = [b for b in ALL if kind(b) == "error"]
    names = {}
    for n, b in enumerate(runs + errors):
        names[b.where] = f"doc{n}.yaml"
        (tmp_path / names[b.where]).write_text(as_case_file(b))
    proc = run_pytest(tmp_path, *(names[b.where] for b in runs), "--report-json", "r.json",
                      "--no-header", "-q")
    records = json.loads((tmp_path / "r.json").read_text())["records"]
    for b in runs:
        mine = [r for r in records if r["file"] == names[b.where]]
        assert mine, f"{b.where}: no instance ran\n{proc.stdout[-3000:]}"
        bad = [r for r in mine if r["outcome"] not in ("passed", "xfail", "skipped")]
        if kind(b) == "passes":
            assert not bad, f"{b.where}: {bad[0]['id']} {bad[0]['outcome']}: {bad[0]['message']}"
        else:
            wrong = [r for r in bad if r["outcome"] in ("failed", "error")]
            assert any(quoted(b) in r["message"] for r in wrong), (
                f"{b.where}: no instance failed with {quoted(b)!r}")
    for b in errors:
        proc = run_pytest(tmp_path, names[b.where], "--collect-only", "-q", "--no-report")
        where = block_position(b)
        assert f"{names[b.where]}:{where}: " in proc.stdout, (b.where, proc.stdout[-2000:])
        assert quoted(b) in proc.stdout, (b.where, proc.stdout[-2000:])


def block_position(b: Block) -> str:
    m = re.search(r"error (\d+:\d+)", b.marker)
    assert m, b.where
    return m.group(1)


# -- commands shown with their output ---------------------------------------------------------

TOOLS = {"pytest": [sys.executable, "-m", "pytest"],
         "collective-gate": [sys.executable, "-m", "harness.gate"],
         "collective-certify": [sys.executable, "-m", "harness.certify"],
         "python": [sys.executable]}
DURATION = re.compile(r"\d+(\.\d+)?s\b")


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """(command line, shown output lines) for each ``$`` line of a console block."""
    out: list[tuple[str, list[str]]] = []
    for line in block.text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            out[-1][1].append(line)
    return out


def shown_in(shown: list[str], actual: str) -> str | None:
    """None when the shown lines appear in order in the actual output, else the first missing.

    ``...`` stands for any lines; durations are compared as a word, not a number, pytest's
    banner lines by their text, and the reports' no-break spaces as spaces."""
    lines = [_banner(DURATION.sub("Ns", ln.rstrip().replace("\u00a0", " ")))
             for ln in actual.split("\n")]
    pos = 0
    for want in shown:
        want = _banner(DURATION.sub("Ns", want.rstrip()))
        if want == "..." or not want:
            continue
        try:
            pos = lines.index(want, pos) + 1
        except ValueError:
            return want
    return None


BANNER = re.compile(r"^=+ (.*) =+$")


def _banner(line: str) -> str:
    """pytest centres its summary line in ``=``: how many depends on how long the run took
    (a run of 10 s or more has one fewer), so only the text inside is compared."""
    m = BANNER.match(line)
    return f"= {m.group(1)} =" if m else line


def run_command(line: str, folder: Path) -> str:
    words = shlex.split(line)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    argv = TOOLS.get(words[0], [words[0]]) + words[1:]
    proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=HANG_S, check=False)
    return proc.stdout + proc.stderr


TUTORIAL = [ROOT / "docs" / "tutorial" / n
            for n in ("first-case.md", "failing-case.md", "reports.md", "gate.md")]
GROUPS = [[p] for p in sorted({b.page for b in ALL if kind(b) == "run"}) if p not in TUTORIAL]


@pytest.mark.parametrize("pages", [TUTORIAL, *GROUPS],
                         ids=lambda ps: str(ps[0].parent.relative_to(ROOT) if len(ps) > 1
                                            else ps[0].relative_to(ROOT)))
def test_commands_print_what_the_page_shows(pages: list[Path], tmp_path: Path) -> None:
    """A page's commands run in order in one folder; the tutorial's pages share one."""
    for page in pages:
        for b in blocks(page):
            name = b.option("file")
            if name:
                (tmp_path / name).write_text(b.text)
            if kind(b) != "run":
                continue
            for line, shown in commands(b):
                actual = run_command(line, tmp_path)
                missing = shown_in(shown, actual)
                assert missing is None, (f"{b.where}: `{line}` did not print {missing!r}; "
                                         f"it printed:\n{actual[-3000:]}")


def test_the_report_picture_is_a_screenshot_of_a_failing_run() -> None:
    """docs/img/report.png comes from the browser test (tests/test_html_report.py, with
    COLLECTIVE_DOCS_SCREENSHOT set): a real page with passing and failing cells."""
    from tests.test_html_report import FAILED_RGB, PASSED_RGB, pixels_near, read_png
    img = read_png(ROOT / "docs" / "img" / "report.png")
    assert img.shape == (700, 1000, 3)
    assert pixels_near(img, PASSED_RGB) > 300 and pixels_near(img, FAILED_RGB) > 300
