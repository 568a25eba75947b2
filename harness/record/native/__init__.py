"""The C++ kernel for ``c10d::`` ops: built once with torch's extension builder, else none.

Why: the Python kernel (:mod:`harness.record.hook`) costs the rank's thread tens of
microseconds per call, most of it in the dispatcher boxing each argument into a Python object
and in the capture running as Python; at world size 2 on the 2-core machine that is about twice
the plain call, close to the 5 % budget on a DDP step (docs/howto/record.md). ``hook.cpp`` reads the
same facts from the dispatcher's stack in C++ and queues them; the flusher thread turns the
queue into the Python kernel's records (:func:`records`), so the trace is the same.

It needs a C++ compiler and torch's headers (both come with a usual torch install plus
``g++``); ``collective-record`` builds it before starting the program (about 30 s the first
time on an idle machine, minutes on a busy one, announced on stderr; then cached under
``TORCH_EXTENSIONS_DIR``, from a copy of the sources there so that every checkout of the same
sources finds the one build; each torch install, e.g. each venv, builds its own), and the
ranks load the built module. Where it cannot be built, recording uses the Python kernel and
says so. The ``_c10d_functional::`` ops (DTensor, FSDP2) stay on the Python kernel either way:
matching their ``wait_tensor`` needs the Python tensor objects.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.record.capture import GROUP, CallTuple, capture_group_name, classify, site_json

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "hook.cpp"
# collective-guard's kernel and its digests, in the same module
SOURCES = (SOURCE, HERE / "guard.cpp", HERE / "digest.cpp")
HEADERS = (HERE / "common.h", HERE / "digest.h", HERE / "digest_loops.h")
# Without contraction into fused multiply-adds the C++ digests add in digest.py's order.
CFLAGS = ["-O3", "-ffp-contract=off"]


def kernel_name(torch_home: str) -> str:
    """The kernel's module name, which names its build folder: the hash of the sources, the
    flags and the torch install at ``torch_home``.

    Why: torch's builder keys its cache by name only across processes. Worktrees or installs
    with different sources then build into folders of their own instead of rebuilding one
    folder in turn; so do two environments (two venvs) with the same sources, whose build
    files name different torch headers and libraries: sharing one folder, each rebuilt it
    when the other had (minutes on a busy machine, every recorder waiting on its lock)."""
    data = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    return "collective_record_hook_" + hashlib.sha256(
        data + " ".join(CFLAGS).encode() + b"\0" + torch_home.encode()).hexdigest()[:12]


def torch_dir() -> str:
    """Where the torch package this process would import lies, found without importing it
    ("" where there is none)."""
    spec = importlib.util.find_spec("torch")
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    return str(Path(places[0]).resolve()) if places else ""


NAME = kernel_name(torch_dir())
_MODULE: list[Any] = []  # the loaded extension, once


class NativeUnavailable(Exception):
    """The C++ kernel cannot be built or loaded here (the message says why)."""


def load(verbose: bool = False) -> Any:
    """The extension module, built first if it is not built yet (torch caches the build by the
    source's hash, under a file lock, so concurrent ranks build it once)."""
    if _MODULE:
        return _MODULE[0]
    from torch.utils import cpp_extension
    _ninja_on_path()
    log = logging.getLogger(cpp_extension.__name__)
    level = log.level
    log.setLevel(logging.ERROR)  # its compiler warnings would be lines a user cannot act on
    try:
        with warnings.catch_warnings(), build_lock(build_folder()):
            warnings.simplefilter("ignore")
            mod = cpp_extension.load(NAME, _stable_sources(cpp_extension), extra_cflags=CFLAGS,
                                     verbose=verbose)
    except Exception as exc:  # a compiler, a header or ninja missing: the reason, one line
        text = " ".join(str(exc).split())
        raise NativeUnavailable(("..." + text[-300:]) if len(text) > 300
                                else text or type(exc).__name__) from None
    finally:
        log.setLevel(level)
    _MODULE.append(mod)
    return mod


@contextlib.contextmanager
def build_lock(folder: Path | None) -> Iterator[None]:
    """Hold the harness's own lock on ``folder`` around torch's builder, and remove torch's
    lock file found there meanwhile.

    Why: torch's lock is a file whose existence is the lock. A build killed mid-way (a first
    ``collective-record`` stopped with Ctrl-C, a CI job cancelled) leaves it behind, and torch
    then waits for it without end in every later load on the machine, built or not. This lock
    (``flock``) is released by the kernel when its holder dies, and every load of the harness
    holds it around torch's: a torch lock file seen while holding it was left by a build that
    no longer runs."""
    if folder is None:
        yield
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / "harness.flock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # an unwritable cache folder: the build itself will say why
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process's build: waiting for it is right
        with contextlib.suppress(FileNotFoundError):
            (folder / "lock").unlink()
        yield
    finally:
        os.close(fd)  # releases the lock


def build_folder() -> Path | None:
    """Where torch's builder keeps this kernel (under ``TORCH_EXTENSIONS_DIR`` or torch's
    default cache), or None where this torch does not say."""
    from torch.utils import cpp_extension
    where = getattr(cpp_extension, "_get_build_directory", None)
    if where is None:
        return None
    try:
        return Path(where(NAME, False))
    except Exception:  # an unwritable cache folder: the build itself will say why
        return None


def is_built() -> bool:
    """Whether the kernel is built and cached already, so that :func:`load` only loads it."""
    if _MODULE:
        return True
    folder = build_folder()
    return folder is not None and (folder / f"{NAME}.so").exists()


def load_announced(prog: str) -> Any:
    """:func:`load`, saying first on stderr that the kernel is being built where it is not
    cached yet: the build takes from half a minute to minutes with nothing else printed, which
    reads as a hang the first time."""
    if not is_built():
        folder = build_folder()
        where = f" under {folder.parent}" if folder is not None else ""
        print(f"{prog}: building the C++ recording kernel (once: about 30 s on an idle machine, "
              f"minutes on a busy one; cached{where} for later runs)...", file=sys.stderr,
              flush=True)
    return load()


def _stable_sources(cpp_extension: Any) -> list[str]:
    """The sources, copied once into a folder named by their hash beside the builds.

    Why: torch's builder writes the source paths into its build file, and ninja rebuilds when
    that file's commands change; checkouts, worktrees and installs of the same sources at
    different paths (gpu-check's dry run installs the project into a temporary folder) shared
    one build folder and rebuilt it in turn, two minutes or more on a busy machine. Built from
    one path, a second checkout finds the build current."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    folder = Path(root) / f"{NAME}-sources"
    paths: list[str] = []
    for src in (*SOURCES, *HEADERS):  # the headers beside the sources: they #include them
        data = src.read_bytes()
        dest = folder / src.name
        try:
            current = dest.read_bytes() == data
        except OSError:
            current = False
        if not current:  # written whole, then renamed: a concurrent build never reads half
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / f".{src.name}.{os.getpid()}.part"
            part.write_bytes(data)
            os.replace(part, dest)
        if src in SOURCES:
            paths.append(str(dest))
    return paths


def _ninja_on_path() -> None:
    """torch's builder runs ``ninja`` from PATH; the ``ninja`` package (a dependency) puts it
    in the environment's scripts folder, which is not on PATH unless the venv is activated."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([str(ninja.BIN_DIR), os.environ.get("PATH", "")])


def _thread_name() -> str:
    return threading.current_thread().name


def install(mod: Any, start: Any) -> None:
    """Give the module the Python it calls the first time it meets a code object, a thread
    or a group, and ``start`` at its first recorded call."""
    # capture_group_name caches the group's ranks by name while the group exists
    mod.install(classify, _thread_name, capture_group_name, start)


def _group_of(name: str) -> Any:
    try:  # cached when the kernel first met the group, while it existed
        return capture_group_name(name)
    except Exception:  # never resolvable: written with no ranks rather than stop the writer
        return (GROUP, ())


def records(mod: Any) -> list[tuple[CallTuple | None, int, Any]]:
    """What the C++ kernel queued since the last call: (the call as the Python kernel records
    it, or None when only its Work came later; its seq; the Work it returned, or None)."""
    out: list[tuple[CallTuple | None, int, Any]] = []
    for qualname, args, api, code, line, thread, seq, work in mod.drain():
        if qualname is None:
            out.append((None, seq, work))
            continue
        captured = tuple((name, _group_of(payload) if tag == GROUP else (tag, payload))
                         for name, (tag, payload) in args)
        site = site_json(None if code is None else (code, line))
        out.append(((qualname, captured, api, site, thread, seq), seq, work))
    return out
