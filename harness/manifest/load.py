"""Read and check a capability manifest (``--manifest FILE``).

The format (docs/howto/certify.md owns its description)::

    backend: torchft-gloo        # the name the backend is registered under (required)
    module: examples.backends.torchft_cpu   # optional: what --backend-module to import
    inherits: gloo               # optional: the backend it wraps
    devices: [cpu]               # optional: the devices it runs on (default: cpu and cuda)
    supports:                    # optional; what a key leaves out is claimed
      ops: [all_reduce, broadcast, p2p]    # op names, or families (p2p, objects, ...)
      dtypes: [float32, int64]
      reduce_ops: [sum, max]
      subgroups: false           # capabilities: true (claimed) or false
    reasons:                     # optional: why an item is not supported, shown per cell
      reduce: "the wrapper implements no reduce"

Everything the file leaves unsaid is claimed: a manifest that says only ``backend:`` claims
the whole contract, and a backend earns its declared gaps by writing them down. Errors are
one line at ``file:line:col`` with the nearest known name; nothing in the file is run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import dtypes, ops
from ..casefile.fields import suggest
from ..casefile.load import Document, load_file
from ..errors import CaseFileError

# What a backend may declare beyond ops, dtypes and reduce ops, with what each one covers
# (the certificate's capability column; harness.manifest.needs decides which instances use it).
CAPABILITIES: dict[str, str] = {
    "async": "async_op=True and waiting on the returned Work",
    "coalescing": "coalesced ops (all_reduce_coalesced, the coalescing manager)",
    "bitwise_reductions": "BAND, BOR and BXOR reductions",
    "gather_single": "gather into one tensor (gather_single, gather_into_tensor)",
    "subgroups": "ops on groups other than the world (group: lists, new_group steps)",
    "split": "split_group",
    "sparse": "sparse COO tensors",
    "complex": "complex dtypes",
    "float8": "float8 dtypes",
    "cuda_graphs": "collectives captured in and replayed from CUDA graphs",
    "timeouts": "per-group timeouts (set_timeout, group_timeout)",
    "sequence_numbers": "per-group and per-Work sequence numbers",
    "timing": "collectives timing (a Work's _get_duration())",
    "lifecycle": "destroying a group while the world goes on",
}
KEYS = ("backend", "module", "inherits", "devices", "supports", "reasons")
LISTS = ("ops", "dtypes", "reduce_ops")
DEVICES = ("cpu", "cuda")
NAME = re.compile(r"^[A-Za-z0-9_.:+-]{1,100}$")


@dataclass(frozen=True)
class Manifest:
    """A backend's declaration, checked. ``None`` in a list: everything claimed."""

    file: str
    backend: str
    module: str = ""
    inherits: str = ""
    devices: tuple[str, ...] = DEVICES
    ops: frozenset[str] | None = None  # op names and families claimed
    dtypes: frozenset[str] | None = None
    reduce_ops: frozenset[str] | None = None
    unsupported: frozenset[str] = frozenset()  # capabilities declared false
    reasons: tuple[tuple[str, str], ...] = ()

    def reason(self, item: str) -> str:
        """Why ``item`` is not supported, as the manifest says ("" where it says nothing)."""
        return dict(self.reasons).get(item, "")

    def metadata(self) -> dict[str, Any]:
        """The manifest as report metadata: what the certificate reads back."""
        return {"file": self.file, "backend": self.backend, "inherits": self.inherits,
                "devices": list(self.devices),
                "ops": None if self.ops is None else sorted(self.ops),
                "dtypes": None if self.dtypes is None else sorted(self.dtypes),
                "reduce_ops": None if self.reduce_ops is None else sorted(self.reduce_ops),
                "unsupported_capabilities": sorted(self.unsupported),
                "reasons": dict(self.reasons)}


def op_names() -> tuple[str, ...]:
    """Every name an ``ops:`` entry may use: op names and op families."""
    return tuple(sorted({*ops.ALL_OPS, *(o.family for o in ops.ALL_OPS.values())}))


def read(path: str, display: str | None = None) -> Manifest:
    """The manifest at ``path``; CaseFileError (``file:line:col``) on anything wrong."""
    doc = load_file(path, display)
    return parse(doc)


def parse(doc: Document) -> Manifest:
    """A loaded manifest document, checked."""
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a manifest is a mapping", "start with 'backend: NAME'")
    for key in data:
        if key in (*LISTS, *CAPABILITIES):
            raise doc.error((key,), f"{key!r} belongs under 'supports:'",
                            f"supports: {{{key}: ...}}", at_key=True)
        if key not in KEYS:
            raise doc.error((key,), f"unknown key {str(key)!r}", suggest(str(key), KEYS),
                            at_key=True)
    if "backend" not in data:
        raise doc.error((), "'backend' is required", "backend: the name your module registers")
    backend = _name(doc, ("backend",), data["backend"])
    inherits = _name(doc, ("inherits",), data["inherits"]) if "inherits" in data else ""
    if inherits == backend:
        raise doc.error(("inherits",), f"{backend!r} cannot inherit from itself",
                        "name the backend it wraps, or leave 'inherits' out")
    module = _name(doc, ("module",), data["module"]) if "module" in data else ""
    devices = tuple(_names(doc, ("devices",), data.get("devices", list(DEVICES)), DEVICES))
    supports = data.get("supports", {})
    if not isinstance(supports, dict):
        raise doc.error(("supports",), "'supports' is a mapping",
                        "e.g. supports: {ops: [all_reduce], subgroups: false}")
    choices = {"ops": op_names(), "dtypes": tuple(dtypes.DTYPES),
               "reduce_ops": dtypes.REDUCE_OPS}
    lists: dict[str, frozenset[str] | None] = {}
    off: set[str] = set()
    for key, value in supports.items():
        path = ("supports", key)
        if key in LISTS:
            given = _names(doc, path, value, choices[key])
            if key == "dtypes":
                given = [dtypes.canonical(d) or d for d in given]
            lists[key] = frozenset(given)
        elif key in CAPABILITIES:
            if not isinstance(value, bool):
                raise doc.error(path, f"{key}: {str(value)[:40]!r} is not true or false",
                                f"{key}: false declares it unsupported")
            if not value:
                off.add(key)
        else:
            raise doc.error(path, f"unknown capability {str(key)!r}",
                            suggest(str(key), (*LISTS, *CAPABILITIES)), at_key=True)
    reasons = data.get("reasons", {})
    if not isinstance(reasons, dict) or not all(isinstance(v, str) and len(v) <= 500
                                                for v in reasons.values()):
        raise doc.error(("reasons",), "'reasons' maps an item to a sentence (500 characters "
                        "at most)", "reasons: {reduce: \"the wrapper implements no reduce\"}")
    return Manifest(doc.file, backend, module, inherits, devices, lists.get("ops"),
                    lists.get("dtypes"), lists.get("reduce_ops"), frozenset(off),
                    tuple(sorted((str(k), v) for k, v in reasons.items())))


def _name(doc: Document, path: tuple[str, ...], value: Any) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise doc.error(path, f"{path[-1]}: {str(value)[:60]!r} is not a name",
                        "letters, digits and _ . : + - (100 at most)")
    return value


def _names(doc: Document, path: tuple[str, ...], value: Any,
           choices: tuple[str, ...]) -> list[str]:
    if not isinstance(value, list):
        raise doc.error(path, f"{path[-1]} is a list", f"e.g. {path[-1]}: [{choices[0]}]")
    out: list[str] = []
    for i, item in enumerate(value):
        name = dtypes.canonical(item) if path[-1] == "dtypes" and isinstance(item, str) else item
        if not isinstance(item, str) or (name or item) not in choices:
            raise doc.error((*path, i), f"unknown {path[-1].rstrip('s')} {str(item)[:40]!r}",
                            suggest(str(item), choices))
        out.append(str(name or item))
    return out


def error_line(exc: CaseFileError) -> str:
    """One line for a terminal: where, what was wrong, and the hint."""
    where = f" at {exc.path}:" if exc.path else ""
    return f"{exc.pos}:{where} {exc.message}" + (f" ({exc.hint})" if exc.hint else "")
