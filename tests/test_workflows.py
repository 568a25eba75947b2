"""The GitHub workflows: valid against the workflow schema, safe on the GPU runner, and every
command they (and the CI scripts they call) reference exists in this repository."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.runs import REPO

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
CPU = REPO / ".github" / "workflows" / "conformance-gloo.yml"
GPU = REPO / ".github" / "workflows" / "conformance-nccl.yml"


def load(path: Path) -> dict[str, Any]:
    raw: dict[Any, Any] = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as a boolean
    return {("on" if k is True else str(k)): v for k, v in raw.items()}


def check_jsonschema(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True, check=False)


def test_workflows_exist() -> None:
    assert CPU in WORKFLOWS and GPU in WORKFLOWS


def test_workflows_match_the_github_workflow_schema() -> None:
    proc = check_jsonschema(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    """The validator really validates: a job without runs-on and a bad timeout fail."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    timeout-minutes: soon\n    steps:\n"
                   "      - run: echo\n")
    proc = check_jsonschema(bad)
    assert proc.returncode != 0 and "bad.yml" in proc.stdout + proc.stderr


def steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


@pytest.mark.parametrize("path", [CPU, GPU], ids=["gloo", "nccl"])
def test_each_workflow_gates_summarises_and_keeps_artifacts(path: Path) -> None:
    doc = load(path)
    assert doc["concurrency"]["group"] and "cancel-in-progress" in doc["concurrency"]
    assert doc["permissions"] == {"contents": "read"}
    conformance = next(iter(doc["jobs"].values()))
    assert isinstance(conformance["timeout-minutes"], int)
    runs = [s.get("run", "") for s in steps(doc)]
    assert any(r.startswith("bash ci/gate.sh ") for r in runs)
    summary = next(s for s in steps(doc) if "ci/step_summary.py" in s.get("run", ""))
    assert summary["if"] == "always()"  # the verdict is written even when the gate failed
    assert "--gate reports/gate.md --matrix reports/conformance.md" in summary["run"]
    upload = next(s for s in steps(doc) if s.get("uses", "").startswith(
        "actions/upload-artifact@"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "reports/"
    assert all(s["uses"].split("@")[1].startswith("v") for s in steps(doc) if "uses" in s)


def test_gpu_workflow_runs_pull_requests_from_the_base_branch_with_only_their_cases() -> None:
    """README "Running untrusted cases": the workflow, harness, CI scripts and baseline are the
    base branch's; only cases/**/*.yaml comes from the pull request; no conftest.py runs."""
    doc = load(GPU)
    text = GPU.read_text()
    # pull_request would run the pull request's own copy of this workflow
    assert "pull_request" not in doc["on"] and "pull_request_target" in doc["on"]
    assert doc["permissions"] == {"contents": "read"} and "secrets." not in text
    (job,) = doc["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    assert "head.repo.full_name == github.repository" in job["if"]
    assert "contains(github.event.pull_request.labels.*.name, 'gpu-conformance')" in job["if"]
    checkout = job["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@")
    assert "ref" not in checkout.get("with", {})  # the base branch, never the head
    assert checkout["with"]["persist-credentials"] is False
    take = job["steps"][1]
    assert take["if"] == "github.event_name == 'pull_request_target'"
    assert take["run"] == 'bash ci/pr-cases.sh "$PR_REPO" "$PR_SHA"'  # no ${{ }} in the script
    runs = [s.get("run", "") for s in job["steps"]]
    gate = runs.index("bash ci/gate.sh nccl ci/baselines/nccl-cuda.json")
    assert runs.index(take["run"]) < gate
    assert all("${{" not in r for r in runs)  # event data reaches scripts only through env
    assert "--noconftest" in (REPO / "ci" / "gate.sh").read_text()
    assert "${{ github.event.pull_request.number || github.ref }}" in doc["concurrency"]["group"]
    cpu = load(CPU)
    assert all(j["runs-on"] == "ubuntu-latest" for j in cpu["jobs"].values())


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_pr_cases_takes_only_regular_case_yaml_files(tmp_path: Path) -> None:
    """ci/pr-cases.sh against a hostile pull request: changed harness code, a conftest.py,
    a pytest.ini and a symlink beside the cases; only the YAML case files are taken."""
    base = tmp_path / "base"
    (base / "cases").mkdir(parents=True)
    (base / "ci").mkdir()
    (base / "harness").mkdir()
    shutil.copy(REPO / "ci" / "pr-cases.sh", base / "ci" / "pr-cases.sh")
    (base / "harness" / "x.py").write_text("SAFE = True\n")
    (base / "cases" / "old.yaml").write_text("cases: []\n")
    (base / "cases" / "kept.yaml").write_text("base version\n")
    _git(base, "init", "-q")
    _git(base, "add", "-A")
    _git(base, "commit", "-qm", "base")
    pr = tmp_path / "pr"
    _git(tmp_path, "clone", "-q", str(base), str(pr))
    (pr / "harness" / "x.py").write_text("import os; os.system('evil')\n")
    (pr / "cases" / "conftest.py").write_text("import os; os.system('evil')\n")
    (pr / "cases" / "pytest.ini").write_text("[pytest]\naddopts = -p evil\n")
    (pr / "cases" / "old.yaml").unlink()
    (pr / "cases" / "kept.yaml").write_text("pr version\n")
    (pr / "cases" / "sub").mkdir()
    (pr / "cases" / "sub" / "new.yml").write_text("cases: [new]\n")
    (pr / "cases" / "link.yaml").symlink_to("/etc/hostname")
    (pr / "ci" / "pr-cases.sh").write_text("echo evil\n")
    _git(pr, "add", "-A")
    _git(pr, "commit", "-qm", "pr")
    sha = _git(pr, "rev-parse", "HEAD")
    proc = subprocess.run(["bash", "ci/pr-cases.sh", str(pr), sha], cwd=base,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (base / "harness" / "x.py").read_text() == "SAFE = True\n"
    assert "evil" not in (base / "ci" / "pr-cases.sh").read_text()
    files = sorted(str(p.relative_to(base)) for p in (base / "cases").rglob("*"))
    assert files == ["cases/kept.yaml", "cases/sub", "cases/sub/new.yml"]
    assert (base / "cases" / "kept.yaml").read_text() == "pr version\n"
    assert "not a regular file" in proc.stdout
    bad = subprocess.run(["bash", "ci/pr-cases.sh", str(pr), "HEAD; echo x"], cwd=base,
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2


# -- every command referenced exists -------------------------------------------------------------

def console_scripts() -> set[str]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return set(meta["project"]["scripts"])


# The NCCL baseline is created on the first GPU run (ci/gate.sh gates on raw outcomes until
# then, README "Gating in CI"); every other file a workflow names must be committed.
OPTIONAL = {"ci/baselines/nccl-cuda.json"}
VENV_TOOLS = {"python", "python3", "pip", "pytest", "ruff", "mypy",  # installed by ci/setup.sh
              "mkdocs"}  # with the docs extra (ci/test.sh asks for it)


def module_exists(dotted: str) -> bool:
    """Whether ``python -m dotted`` finds a module on sys.path, without importing it.

    PathFinder, not importlib.util.find_spec: the latter asks setuptools' distutils shim on
    sys.meta_path, which on "pip" switches its own distutils off for the whole process, and a
    later import of torch.utils.cpp_extension in the same xdist worker then fails."""
    path: list[str] | None = None
    for part in dotted.split("."):
        spec = PathFinder.find_spec(part, path)
        if spec is None:
            return False
        path = list(spec.submodule_search_locations or [])
    return True


def check_command(words: list[str], where: str) -> list[str]:
    """Problems with one simple command (a list of shell words)."""
    problems: list[str] = []
    if not words:
        return problems
    prog, args = words[0], words[1:]
    if prog.startswith(".venv/bin/"):
        tool = prog.removeprefix(".venv/bin/")
        if tool not in VENV_TOOLS | console_scripts():
            problems.append(f"{where}: {prog}: not a console script of pyproject.toml")
        prog = "python" if tool.startswith("python") else tool
    if (prog in ("bash", "sh", "python", "python3") and args and not args[0].startswith("-")
            and not (REPO / args[0]).is_file()):
        problems.append(f"{where}: {prog} {args[0]}: no such file in the repository")
    if prog in ("python", "python3") and args[:1] == ["-m"]:
        module = args[1]
        local = REPO / (module.replace(".", "/") + ".py")
        if not local.is_file() and not module_exists(module):
            problems.append(f"{where}: python -m {module}: no such module")
    for word in words:
        for path in re.findall(r"(?<![\w/.-])(\.?ci/[\w./-]+)", word):
            if not (REPO / path).exists() and path not in OPTIONAL:
                problems.append(f"{where}: {path}: no such file in the repository")
    return problems


def simple_commands(script: str) -> list[list[str]]:
    """Shell words of each simple command (split on newlines, ;, &&, ||, |)."""
    out: list[list[str]] = []
    text = script.replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            while words and re.match(r"^\w+=", words[0]):  # VAR=value prefixes
                words = words[1:]
            if words and words[0] in ("exit", "echo", "printf", "if", "then", "fi", "else",
                                      "set", "cd", "mkdir", "rm", "shift", "[", "]", "local"):
                continue
            if words:
                out.append(words)
    return out


def test_every_command_referenced_exists() -> None:
    problems: list[str] = []
    seen_scripts: set[str] = set()
    for path in WORKFLOWS:
        for s in steps(load(path)):
            if "run" not in s:
                continue
            for words in simple_commands(s["run"]):
                problems += check_command(words, f"{path.name}: {s.get('name', s['run'])}")
                if words[0] == "bash":
                    seen_scripts.add(words[1])
    assert {"ci/setup.sh", "ci/gate.sh", "ci/system-packages.sh", "ci/test.sh"} <= seen_scripts
    for script in sorted(seen_scripts):  # and what the scripts themselves run
        for words in simple_commands((REPO / script).read_text()):
            problems += check_command(words, script)
    assert not problems, "\n".join(problems)


def test_command_check_catches_a_missing_file() -> None:
    assert check_command(["bash", "ci/nope.sh"], "w")
    assert check_command([".venv/bin/collective-nothing", "x"], "w")
    assert check_command(["python", "-m", "harness.nothing"], "w")
    assert check_command(["bash", "ci/gate.sh", "gloo", "ci/baselines/typo.json"], "w")
    assert not check_command([".venv/bin/collective-gate", "reports/x.json",
                              "ci/baselines/gloo-cpu.json"], "w")


def test_ci_scripts_parse() -> None:
    for script in sorted((REPO / "ci").glob("*.sh")):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"


# -- torch versions ------------------------------------------------------------------------------

VERSIONS = REPO / ".github" / "workflows" / "torch-versions.yml"


def test_torch_versions_workflow_runs_oldest_and_newest_on_cpu_wheels() -> None:
    doc = load(VERSIONS)
    assert VERSIONS in WORKFLOWS  # so the schema and command checks above cover it
    (job,) = doc["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and isinstance(job["timeout-minutes"], int)
    assert job["strategy"]["fail-fast"] is False  # one version failing still shows the other
    versions = job["strategy"]["matrix"]["torch"]
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    floor = next(d for d in meta["project"]["dependencies"] if d.startswith("torch"))
    oldest = floor.split(">=")[1]
    # the oldest supported release line and something newer than the CI pin
    assert versions[0].startswith(oldest + "."), (versions, floor)
    pin = (REPO / "ci" / "constraints.txt").read_text().split("torch==")[1].split()[0]
    newest = versions[-1]
    assert tuple(map(int, newest.split("."))) > tuple(map(int, pin.split("."))), (newest, pin)
    runs = [s.get("run", "") for s in job["steps"]]
    matrix_run = next(r for r in runs if "ci/torch-matrix.sh" in r)
    words = shlex.split(matrix_run)
    assert words[:3] == ["bash", "ci/torch-matrix.sh", "${{ matrix.torch }}"]
    # CPU wheels: PyTorch's CPU index, not the multi-GB CUDA builds
    assert words[words.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith(
        "actions/upload-artifact@"))
    assert upload["if"] == "always()" and "${{ matrix.torch }}" in upload["with"]["name"]


def test_torch_matrix_script_rejects_bad_usage() -> None:
    script = str(REPO / "ci" / "torch-matrix.sh")
    proc = subprocess.run(["bash", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 4 and "usage: bash ci/torch-matrix.sh VERSION" in proc.stderr
    proc = subprocess.run(["bash", script, "2.4.1", "--bogus"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 4 and "unknown option '--bogus'" in proc.stderr


def test_the_module_check_leaves_torch_s_extension_builder_importable() -> None:
    """Asking whether ``python -m pip`` exists once switched setuptools' own distutils off for
    the rest of the xdist worker, and the recording kernel's tests after it failed in CI."""
    code = ("from tests.test_workflows import module_exists\n"
            "assert module_exists('pip')\n"
            "from torch.utils import cpp_extension\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
