"""The rank side of the recorder: c10d dispatcher ops seen at the Autograd key.

Why this mechanism (measured on torch 2.13, see docs/record.md): DDP's Reducer and
``_broadcast_coalesced`` call ``ProcessGroup::allreduce``/``broadcast`` from C++, so wrapping the
Python functions of ``torch.distributed`` misses them; every ProcessGroup method goes through the
dispatcher as a ``c10d::*`` op, and DTensor/FSDP2 issue ``_c10d_functional::*`` ops. A Python
kernel registered for those ops at the AutogradCPU/AutogradCUDA keys sees all of them and costs
nothing for the other ops (a TorchDispatchMode would put every aten op through Python). It then
redispatches below Autograd, so the op itself runs unchanged. Ops issued beneath Autograd (under
``torch.inference_mode()``, or from inside a tensor subclass's ``__torch_dispatch__``) are not
seen: the functional collectives' ``wait_tensor`` is caught by wrapping the Python function the
async tensor calls instead.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import json
import os
import select
import signal
import sys
import threading
import time
import weakref
from pathlib import Path
from types import CodeType
from typing import Any, NoReturn, TextIO

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch._C import _distributed_c10d as c10d

from harness.record.trace import FORMAT, VERSION

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_HERE = str(Path(__file__).resolve().parent)
_DIST_DIR = os.path.join(_TORCH_DIR, "distributed")
_API_FILES = {dist.distributed_c10d.__file__, fc.__file__}
_REDUCE = {0: "sum", 1: "avg", 2: "product", 3: "min", 4: "max", 5: "band", 6: "bor",
           7: "bxor", 8: "premul_sum"}
_MAX_PENDING = 4096  # Works kept to match a later wait(); oldest forgotten past this
FLUSH_RECORDS = 512  # a batch is written once this many records are waiting ...
FLUSH_SECONDS = 0.5  # ... or by the flusher thread this often, whichever comes first
_SIGNALS = ("SIGTERM", "SIGHUP")  # flushed, then the default action (the process dies)


class Recorder:
    """Writes this process's calls as JSON lines, one record per line.

    Records are kept in memory and written in batches (every ``FLUSH_RECORDS`` records, and
    by a daemon thread every ``FLUSH_SECONDS``), so a call costs a list append, not a write.
    What a dying process has not written yet is written on the way out: at exit (atexit), in
    ``os._exit`` (wrapped), and on SIGTERM/SIGHUP (when their action is the default: the
    flusher thread is woken through the signal wakeup fd, so a rank blocked in a collective
    is flushed too, then dies by the signal as it would have). Only a SIGKILL or a crash in
    C++ can lose records: at most the last ``FLUSH_SECONDS``.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.out: TextIO | None = None
        self.buf: list[dict[str, Any]] = []  # records not written yet, encoded when written
        self.seq = itertools.count()
        self.calls = 0
        self.lock = threading.Lock()
        self.local = threading.local()
        self.works: dict[int, tuple[int, Any]] = {}  # id(pybind Work) -> (seq, the Work)
        self.tensors: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.tensor_seq: dict[int, int] = {}
        self.groups: dict[str, list[int]] = {}
        self.wake: int = -1  # read end of the signal wakeup pipe, when there is one
        self.opened = False  # a record written after close() appends, never truncates

    def depth(self) -> int:
        return int(getattr(self.local, "depth", 0))

    def emit(self, kind: str, body: dict[str, Any]) -> None:
        with self.lock:
            if not self.opened and not self.buf:
                self.buf.append({"header": self.header()})
            self.buf.append({kind: body})
            if len(self.buf) >= FLUSH_RECORDS:
                self._write()

    def flush(self) -> None:
        with self.lock:
            self._write()

    def _write(self) -> None:  # the lock is held
        if not self.buf:
            return
        if self.out is None:
            self.open()
        assert self.out is not None
        self.out.write("".join(_ENC.encode(r) + "\n" for r in self.buf))
        self.out.flush()
        self.buf.clear()

    def header(self) -> dict[str, Any]:
        """The header line, taken at the first record (the group may be gone by the time a
        batch is written)."""
        rank = dist.get_rank() if dist.is_initialized() else -1
        world = dist.get_world_size() if dist.is_initialized() else -1
        head = {"format": FORMAT, "version": VERSION, "torch": torch.__version__, "rank": rank,
                "world_size": world, "pid": os.getpid(), "argv": sys.argv[:8]}
        return head

    def open(self) -> None:
        path = Path(self.folder) / f"trace-{os.getpid()}.jsonl"
        self.out = path.open("a" if self.opened else "w", encoding="utf-8")
        self.opened = True

    def close(self) -> None:
        with self.lock:
            if self.out is not None or self.buf:
                self.buf.append({"end": {"calls": self.calls}})
                self._write()
            if self.out is not None:
                self.out.close()
                self.out = None

    def after_fork(self) -> None:
        """A forked child writes its own trace: the parent's file and batch are not its; it
        gets its own wakeup pipe (the parent's is shared) and its own flusher thread."""
        self.lock = threading.Lock()
        self.out, self.buf, self.opened = None, [], False
        if self.wake >= 0:
            os.close(self.wake)
            self.wake = -1
            r, w = os.pipe()
            os.set_blocking(w, False)
            signal.set_wakeup_fd(w, warn_on_full_buffer=False)  # the forking thread is main
            self.wake = r
        _start_flusher(self)

    def flusher(self) -> None:
        """The daemon thread: a batch every FLUSH_SECONDS; on a signal, flush and die by it."""
        while True:
            if self.wake >= 0:
                ready = select.select([self.wake], [], [], FLUSH_SECONDS)[0]
            else:
                ready = []
                time.sleep(FLUSH_SECONDS)
            self.flush()
            if ready:
                got = os.read(self.wake, 64)
                for sig in (getattr(signal, n) for n in _SIGNALS):
                    if sig in got:
                        _die_by(self, sig)


def _die_by(rec: Recorder, sig: int) -> None:
    """Flush, then take the signal's default action (from any thread)."""
    rec.flush()
    ctypes.CDLL(None).signal(sig, 0)  # SIG_DFL, set from any thread
    os.kill(os.getpid(), sig)


def _on_signal(signum: int, frame: Any) -> None:
    if _REC is not None:
        _die_by(_REC, signum)


def _start_flusher(rec: Recorder) -> None:
    threading.Thread(target=rec.flusher, name="collective-record-flush", daemon=True).start()


def _install_signals(rec: Recorder) -> None:
    """SIGTERM/SIGHUP whose action is the default: flush first. Done only from the main thread
    and only where no wakeup fd is set (asyncio's, say); else the flusher's timer is all."""
    if threading.current_thread() is not threading.main_thread():
        return
    mine = [s for s in (getattr(signal, n) for n in _SIGNALS)
            if signal.getsignal(s) == signal.SIG_DFL]
    if not mine:
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    if signal.set_wakeup_fd(w, warn_on_full_buffer=False) != -1:
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)
        return
    rec.wake = r
    for s in mine:
        signal.signal(s, _on_signal)


_REC: Recorder | None = None
_ENC = json.JSONEncoder(separators=(",", ":"))
# code object -> (user code: a candidate call site, torch.distributed function name or None,
# public API file). Filled once per code object: a frame costs a dict lookup.
_CODES: dict[CodeType, tuple[bool, str | None, bool]] = {}


def _classify(code: CodeType) -> tuple[bool, str | None, bool]:
    name = code.co_filename
    user = not (name.startswith(_TORCH_DIR) or name.startswith(_HERE) or name.startswith("<"))
    dist_fn = code.co_name if code.co_name != "wrapper" and name.startswith(_DIST_DIR) else None
    got = (user, dist_fn, name in _API_FILES)
    _CODES[code] = got
    return got


def _where(skip: int) -> tuple[str, str | None]:
    """One walk of the Python stack: the user's call site (the innermost frame outside torch
    and the recorder) and the torch.distributed function the user called (the outermost
    frame of the public API files, else the outermost torch.distributed frame; none for
    calls issued from C++, such as DDP's Reducer)."""
    f: Any = sys._getframe(skip)
    site = None
    api = outer = None
    codes = _CODES
    while f is not None:
        code = f.f_code
        kind = codes.get(code) or _classify(code)
        if kind[0]:
            if site is None:
                site = f"{code.co_filename}:{f.f_lineno}"
        elif kind[1] is not None:
            outer = kind[1]
            if kind[2]:
                api = kind[1]
        f = f.f_back
    return site or "?", api or outer


def _site() -> str:
    return _where(2)[0]


def _tensor(t: Any) -> dict[str, Any]:
    return {"shape": list(t.shape), "stride": list(t.stride()) if t.layout == torch.strided
            else None, "contiguous": bool(t.is_contiguous()), "dtype": str(t.dtype)[6:],
            "device": t.device.type, "layout": str(t.layout)[6:]}


def _ranks(rec: Recorder, pg: Any) -> list[int]:
    if not isinstance(pg, c10d.ProcessGroup):
        pg = c10d.ProcessGroup.unbox(pg)
    name = pg.group_name
    if name not in rec.groups:
        rec.groups[name] = list(dist.get_process_group_ranks(pg))
    return rec.groups[name]


def _group_by_name(rec: Recorder, name: str) -> list[int]:
    if name not in rec.groups:
        pg = c10d._resolve_process_group(name)  # type: ignore[arg-type]
        rec.groups[name] = list(dist.get_process_group_ranks(pg))
    return rec.groups[name]


def _encode(rec: Recorder, name: str, kind: str, value: Any, call: dict[str, Any]) -> None:
    """One argument into the call record: tensors described, groups as global ranks."""
    if "ProcessGroup" in kind:
        call["group"] = _ranks(rec, value)
    elif "ReduceOp" in kind:
        call["reduce_op"] = _REDUCE.get(int(value.op()), str(int(value.op())))
    elif name == "group_name":
        call["group"] = _group_by_name(rec, str(value))
    elif name == "reduce_op":
        call["reduce_op"] = str(value).lower()
    elif isinstance(value, torch.Tensor):
        call["args"][name] = _tensor(value)
    elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        call["args"][name] = [_tensor(t) for t in value]
    elif isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
        call["args"][name] = [[_tensor(t) for t in inner] for inner in value]
    elif value is None or isinstance(value, (bool, int, float, str)):
        call["args"][name] = value
    elif isinstance(value, (list, tuple)):
        call["args"][name] = [int(v) for v in value]
    else:
        call["args"][name] = f"<{type(value).__name__}>"


def _encode_tensor(rec: Recorder, name: str, kind: str, value: Any,
                   call: dict[str, Any]) -> None:
    call["args"][name] = _tensor(value)


def _encode_tensors(rec: Recorder, name: str, kind: str, value: Any,
                    call: dict[str, Any]) -> None:
    call["args"][name] = [_tensor(t) for t in value]


def _encoder(kind: str) -> Any:
    """The argument's encoder, chosen once per schema argument (what :func:`_encode` does
    for that kind, without its chain of tests)."""
    if kind == "Tensor":
        return _encode_tensor
    if kind == "Tensor[]":
        return _encode_tensors
    return _encode


def _remember_work(rec: Recorder, work: Any, seq: int) -> None:
    # pybind returns the same Python object for the same C++ Work while one is alive, so
    # holding it lets Work.wait() (patched below) find which call it belongs to.
    pw = work if isinstance(work, c10d.Work) else c10d.Work.unbox(work)
    rec.works[id(pw)] = (seq, pw)
    if len(rec.works) > _MAX_PENDING:
        rec.works.pop(next(iter(rec.works)))


def _kernel(qualname: str, op: Any) -> Any:
    kinds = [(a.name, str(a.type), _encoder(str(a.type))) for a in op._schema.arguments]
    by_name = {name: (kind, enc) for name, kind, enc in kinds}

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        rec = _REC
        below = keyset & torch._C._after_autograd_keyset
        if rec is None or rec.depth() > 0:
            return op.redispatch(below, *args, **kwargs)
        call: dict[str, Any] = {"op": qualname, "args": {}}
        for (name, kind, enc), value in zip(kinds, args, strict=False):
            enc(rec, name, kind, value, call)
        for key, value in kwargs.items():
            kind, enc = by_name[key]
            enc(rec, key, kind, value, call)
        site, call["api"] = _where(1)
        call["site"] = site
        call["thread"] = threading.current_thread().name
        seq = next(rec.seq)
        call["seq"] = seq
        rec.calls += 1
        rec.emit("call", call)
        rec.local.depth = rec.depth() + 1
        try:
            out = op.redispatch(below, *args, **kwargs)
        finally:
            rec.local.depth -= 1
        work = out[1] if isinstance(out, tuple) and len(out) == 2 else out
        if isinstance(work, (torch.ScriptObject, c10d.Work)):
            _remember_work(rec, work, seq)
        elif qualname.startswith("_c10d_functional::"):
            for t in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(t, torch.Tensor):
                    rec.tensor_seq[id(t)] = seq
                    rec.tensors[id(t)] = t
            if len(rec.tensor_seq) > _MAX_PENDING:
                rec.tensor_seq.pop(next(iter(rec.tensor_seq)))
        return out

    return kernel


def _wait_event(rec: Recorder, seq: int | None, what: str) -> None:
    rec.emit("wait", {"call": seq, "what": what, "after": rec.calls, "site": _site()})


def _patch_waits(rec: Recorder) -> None:
    orig_wait = c10d.Work.wait

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        entry = rec.works.pop(id(self), None)
        if entry is not None and rec.depth() == 0:
            _wait_event(rec, entry[0], "work")
        return orig_wait(self, *args, **kwargs)

    setattr(c10d.Work, "wait", wait)  # noqa: B010  (a pybind method: mypy forbids =)
    orig_wait_tensor = fc.wait_tensor

    def wait_tensor(tensor: Any) -> Any:
        if rec.depth() == 0:
            key = id(tensor)
            seq = rec.tensor_seq.pop(key, None) if rec.tensors.get(key) is tensor else None
            _wait_event(rec, seq, "tensor")
        rec.local.depth = rec.depth() + 1
        try:
            return orig_wait_tensor(tensor)  # type: ignore[no-untyped-call]
        finally:
            rec.local.depth -= 1

    fc.wait_tensor = wait_tensor


_LIBS: list[Any] = []  # the Library objects must stay alive or their kernels are removed


def install(folder: str) -> None:
    """Start recording this process's collectives into ``folder`` (once per process)."""
    global _REC
    if _REC is not None:
        return
    _REC = Recorder(folder)
    for ns in ("c10d", "_c10d_functional"):
        lib = torch.library.Library(ns, "IMPL")  # type: ignore[no-untyped-call]
        _LIBS.append(lib)
        for full in torch._C._dispatch_get_all_op_names():
            name = full.split("::", 1)[1]
            # check_for_nan and _c10d_functional's _helpers move no data between ranks
            if not full.startswith(ns + "::") or full == "c10d::check_for_nan" or (
                    ns == "_c10d_functional" and name.startswith("_")):
                continue
            op = getattr(getattr(torch.ops, ns), name).default
            for key in ("AutogradCPU", "AutogradCUDA", "AutogradPrivateUse1"):
                lib.impl(name, _kernel(full, op), key,  # type: ignore[no-untyped-call]
                         with_keyset=True)
    _patch_waits(_REC)
    atexit.register(_REC.close)
    _install_signals(_REC)
    _start_flusher(_REC)
    os.register_at_fork(after_in_child=_REC.after_fork)
    orig_exit = os._exit

    def _exit(status: int) -> NoReturn:  # a rank that leaves without Python's shutdown: flush first
        if _REC is not None:
            _REC.flush()
        orig_exit(status)

    os._exit = _exit
