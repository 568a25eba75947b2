"""Bounds on the work a case file may ask for, set by whoever runs the suite.

Case files may come from untrusted pull requests. Every limit here belongs to the operator
(ini or command line, docs/reference/limits.md); a case can ask for less, never for more. Each is
enforced at collection, so a file that asks for too much fails with ``file:line:col`` before a
single rank starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

MIB = 1 << 20


def machine_world_size() -> int:
    """Default world-size cap: the bundled suite's 16 (its long matrix), or more on a machine
    with more cores."""
    return max(16, os.cpu_count() or 1)


@dataclass(frozen=True)
class Limits:
    """Operator limits on case files (defaults in the field values)."""

    file_bytes: int = 256 * 1024  # one case file, checked before parsing (PyYAML: ~10 µs/byte)
    nodes: int = 100_000  # YAML nodes (and values after alias expansion) of one file
    instances_per_file: int = 5_000
    instances_per_session: int = 50_000
    world_size: int = 0  # 0: machine_world_size()
    buffer_bytes: int = 64 * MIB  # one tensor on one rank
    instance_bytes: int = 1024 * MIB  # every buffer of every rank of one instance
    object_bytes: int = 16 * MIB  # payload of one object (the objects generator's size)
    deadline: float = 600.0  # the most a case's own `deadline:` may ask for, in seconds
    sleep: float = 60.0  # sleeps and delays one rank of one instance may ask for, in seconds
    # Collective calls one rank of one instance may issue over all its runs (repeat x
    # deterministic x iterations x steps): 100 runs of 100,000 legal calls would outlast any
    # deadline and be recorded as a hang of a correct backend.
    calls: int = 100_000

    def __post_init__(self) -> None:
        if self.world_size == 0:
            object.__setattr__(self, "world_size", machine_world_size())
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"limit {f.name} must be a positive number, got {value!r}")


# (field, command-line option, ini name, help) for the plugin's options and the options page.
OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("file_bytes", "--max-case-file-bytes", "collective_max_case_file_bytes",
     "largest case file read, in bytes (checked before parsing)"),
    ("nodes", "--max-case-nodes", "collective_max_case_nodes",
     "YAML nodes (and values after alias expansion) per case file"),
    ("instances_per_file", "--max-instances-per-file", "collective_max_instances_per_file",
     "instances one case file may expand to"),
    ("instances_per_session", "--max-instances", "collective_max_instances",
     "instances collected in one session"),
    ("world_size", "--max-world-size", "collective_max_world_size",
     "largest world size a case may ask for (default: max(16, CPU count))"),
    ("buffer_bytes", "--max-buffer-bytes", "collective_max_buffer_bytes",
     "bytes of one buffer on one rank"),
    ("instance_bytes", "--max-instance-bytes", "collective_max_instance_bytes",
     "bytes of all buffers of all ranks of one instance"),
    ("object_bytes", "--max-object-bytes", "collective_max_object_bytes",
     "payload bytes of one object (objects generator 'size:')"),
    ("deadline", "--max-deadline", "collective_max_deadline",
     "the most a case's own 'deadline:' may raise the deadline to, in seconds"),
    ("sleep", "--max-sleep", "collective_max_sleep",
     "seconds of sleeps and delays one rank of one instance may ask for"),
    ("calls", "--max-calls", "collective_max_calls",
     "collective calls one rank of one instance may issue over all its runs (repeat x "
     "deterministic x iterations)"),
)
