"""The wheels a GPU device machine needs to run the harness, and a check that they are complete.

The lent GPU machines run Python 3.12 on x86-64 with torch, NCCL and most of our dependencies
already installed (``ci/gpu/gpu-image-packages.txt``), and reach no package index. What the image
lacks travels in the checkout as wheels (an ignored folder, ``.whl/`` by default) and is
installed there with ``pip install --no-index``. This script runs on a CPU machine with network:

    python ci/gpu/gpu_wheels.py download [--dest .whl]   # fetch them, then check
    python ci/gpu/gpu_wheels.py check [--dest .whl]      # check only (no network)

``check`` fails (exit 1, each problem on a line) when a requirement of the project or of a wheel
is met neither by a wheel nor by the image, when a package has two wheels (the install there
would stop), when a wheel cannot install on CPython 3.12 x86-64 Linux, or when the wheels and
the checkout together pass the 64 MiB a device call can carry.
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)

ROOT = Path(__file__).resolve().parents[2]
PYTHON_VERSION = "3.12"
# The platforms pip may pick for the device (glibc 2.35 there); the order is pip's preference.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
CARRY_LIMIT = 64 * 1024 * 1024  # what one device call carries: the checkout plus the wheels


@dataclass
class Wheel:
    """One wheel file and the requirements its metadata declares."""

    path: Path
    name: str
    version: str
    requires: list[Requirement]
    tags_ok: bool


def device_environment() -> dict[str, str]:
    """Marker values of the device's interpreter (CPython 3.12, Linux x86-64)."""
    env = dict(default_environment())
    env.update(python_version=PYTHON_VERSION, python_full_version=f"{PYTHON_VERSION}.3",
               implementation_name="cpython", platform_python_implementation="CPython",
               sys_platform="linux", platform_system="Linux", os_name="posix",
               platform_machine="x86_64")
    return env


def image_packages(path: Path) -> set[str]:
    """Canonical names of the packages the device image already has."""
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(canonicalize_name(line))
    return names


def project_requirements(pyproject: Path) -> list[Requirement]:
    """The project's core dependencies (extras are for tests and development, not the device)."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return [Requirement(r) for r in data["project"]["dependencies"]]


def _tags_ok(filename: str) -> bool:
    _name, _ver, _build, tags = parse_wheel_filename(filename)
    py = f"cp{PYTHON_VERSION.replace('.', '')}"
    for tag in tags:
        interp_ok = tag.interpreter in (py, "py3", "cp3") or (
            tag.abi == "abi3" and tag.interpreter.startswith("cp3")
            and int(tag.interpreter[3:] or 0) <= int(py[3:]))
        plat_ok = tag.platform == "any" or tag.platform in PLATFORMS or (
            tag.platform.startswith("manylinux_2_") and tag.platform.endswith("_x86_64")
            and int(tag.platform.split("_")[2]) <= 35)
        if interp_ok and plat_ok:
            return True
    return False


def read_wheel(path: Path) -> Wheel:
    """Name, version and requirements of one wheel (from its METADATA)."""
    name, version, _build, _tags = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as zf:
        meta_name = next(n for n in zf.namelist()
                         if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        meta = email.parser.Parser().parsestr(zf.read(meta_name).decode("utf-8"))
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return Wheel(path, str(name), str(version), requires, _tags_ok(path.name))


def checkout_bytes(root: Path) -> int:
    """Bytes of what a device call sends: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
                         check=True, capture_output=True).stdout
    total = 0
    for rel in out.decode("utf-8", "surrogateescape").split("\0"):
        p = root / rel
        if rel and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def check(dest: Path, pyproject: Path, image: set[str]) -> tuple[list[str], list[Wheel]]:
    """Problems with the wheel folder (empty when it is complete) and the wheels in it."""
    problems: list[str] = []
    wheels: list[Wheel] = []
    for p in sorted(dest.glob("*")):
        if p.suffix != ".whl":
            problems.append(f"{p.name}: not a wheel (only wheels install without an index)")
            continue
        try:
            wheels.append(read_wheel(p))
        except (InvalidWheelFilename, InvalidRequirement, zipfile.BadZipFile, StopIteration,
                UnicodeDecodeError) as exc:
            problems.append(f"{p.name}: unreadable wheel ({exc})")
    by_name: dict[str, list[Wheel]] = {}
    for w in wheels:
        by_name.setdefault(w.name, []).append(w)
        if not w.tags_ok:
            problems.append(f"{w.path.name}: does not install on CPython {PYTHON_VERSION} "
                            "x86-64 Linux")
        if w.name in image:
            problems.append(f"{w.path.name}: the image already has {w.name}; a second copy "
                            "would shadow it (delete the wheel)")
    for name, ws in by_name.items():
        if len(ws) > 1:
            problems.append(f"{name}: {len(ws)} wheels ({', '.join(w.version for w in ws)}); "
                            "keep one version")
    env = device_environment()
    wanted: list[tuple[str, Requirement]] = [("the project", r)
                                             for r in project_requirements(pyproject)]
    wanted += [(w.path.name, r) for w in wheels for r in w.requires]
    for who, req in wanted:
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in image:
            continue  # the image's version is what runs; gpu-check.sh imports it there
        have = by_name.get(name)
        if not have:
            problems.append(f"{who} needs {req}: neither a wheel nor in the image")
        elif req.specifier and not any(req.specifier.contains(w.version, prereleases=True)
                                       for w in have):
            problems.append(f"{who} needs {req}: the wheel is {have[0].version}")
    return problems, wheels


def download(dest: Path, pyproject: Path, image: set[str]) -> None:
    """pip-download, for the device's interpreter, what the project needs and the image lacks."""
    dest.mkdir(parents=True, exist_ok=True)
    names = [str(r) for r in project_requirements(pyproject)
             if canonicalize_name(r.name) not in image]
    if not names:
        return
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
           "--python-version", PYTHON_VERSION, "--implementation", "cp", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run([*cmd, *names], check=True)
    # pip fetched the whole closure; drop what the image has (it would shadow the image's copy).
    for p in dest.glob("*.whl"):
        if canonicalize_name(str(parse_wheel_filename(p.name)[0])) in image:
            p.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("download", "check"))
    ap.add_argument("--dest", default=str(ROOT / ".whl"), help="wheel folder (default .whl)")
    ap.add_argument("--image", default=str(ROOT / "ci" / "gpu" / "gpu-image-packages.txt"),
                    help="the packages the device image has, one a line")
    args = ap.parse_args(argv)
    dest, image = Path(args.dest), image_packages(Path(args.image))
    pyproject = ROOT / "pyproject.toml"
    if args.action == "download":
        download(dest, pyproject, image)
    if not dest.is_dir():
        print(f"gpu-wheels: {dest} is not a folder; run `bash ci/gpu-wheels.sh` first",
              file=sys.stderr)
        return 1
    problems, wheels = check(dest, pyproject, image)
    size = sum(w.path.stat().st_size for w in wheels)
    inside = dest.resolve().is_relative_to(ROOT)
    total = size + (checkout_bytes(ROOT) if inside else 0)
    for w in wheels:
        print(f"  {w.path.name}  {w.path.stat().st_size / 1024:.0f} KiB")
    print(f"gpu-wheels: {len(wheels)} wheels, {size / 2**20:.2f} MiB"
          + (f"; with the checkout {total / 2**20:.2f} MiB of the 64 MiB a device call carries"
             if inside else ""))
    if inside and total > CARRY_LIMIT:
        problems.append(f"the checkout and the wheels take {total / 2**20:.1f} MiB, over 64 MiB")
    for p in problems:
        print(f"gpu-wheels: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
