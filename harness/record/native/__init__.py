"""The C++ kernel for ``c10d::`` ops: built once with torch's extension builder, else none.

Why: the Python kernel (:mod:`harness.record.hook`) costs the rank's thread tens of
microseconds per call, most of it in the dispatcher boxing each argument into a Python object
and in the capture running as Python; at world size 2 on the 2-core machine that is about twice
the plain call, close to the 5 % budget on a DDP step (docs/howto/record.md). ``hook.cpp`` reads the
same facts from the dispatcher's stack in C++ and queues them; the flusher thread turns the
queue into the Python kernel's records (:func:`records`), so the trace is the same.

It needs a C++ compiler and torch's headers (both come with a usual torch install plus
``g++``); ``collective-record`` builds it before starting the program (about 25 s the first
time, then cached under ``TORCH_EXTENSIONS_DIR``), and the ranks load the built module. Where it
cannot be built, recording uses the Python kernel and says so. The ``_c10d_functional::`` ops
(DTensor, FSDP2) stay on the Python kernel either way: matching their ``wait_tensor`` needs the
Python tensor objects.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import warnings
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
# Named by the sources' hash: worktrees or installs with different sources then build into
# folders of their own instead of rebuilding one folder in turn (torch's builder keys its
# cache by name only across processes).
NAME = "collective_record_hook_" + hashlib.sha256(
    b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS)) + " ".join(CFLAGS).encode()
).hexdigest()[:12]
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = cpp_extension.load(NAME, [str(p) for p in SOURCES], extra_cflags=CFLAGS,
                                     verbose=verbose)
    except Exception as exc:  # a compiler, a header or ninja missing: the reason, one line
        text = " ".join(str(exc).split())
        raise NativeUnavailable(("..." + text[-300:]) if len(text) > 300
                                else text or type(exc).__name__) from None
    finally:
        log.setLevel(level)
    _MODULE.append(mod)
    return mod


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
