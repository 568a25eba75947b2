"""The guard's settings: checked once in the parent (one-line errors), passed to the ranks.

The parent validates the command line and hands the ranks the result as JSON in
``COLLECTIVE_GUARD_SETTINGS``; a rank validates it again (the variable may come from anywhere)
and, if it is bad, runs unguarded after one line rather than fail the job.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from harness.mutate.faults import FAITHFUL
from harness.mutate.faults import NAMES as FAULTS

ENV = "COLLECTIVE_GUARD_SETTINGS"
DIR_ENV = "COLLECTIVE_GUARD_DIR"
MODES = ("warn", "raise", "abort")
HOOKS = ("native", "python")
MAX_EVERY = 10**9
MAX_CHUNK = 1 << 24
MAX_KEEP = 1 << 16  # elements of one rank's input a finding's case may carry
DEFAULT_EVERY = 100
DEFAULT_CHUNK = 1 << 16
FAMILIES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "p2p")


class SettingsError(ValueError):
    """A setting out of range or of the wrong kind (the message is one line)."""


@dataclass(frozen=True)
class Settings:
    """What the ranks do: check 1 call in ``every`` per op family and group."""

    every: int = DEFAULT_EVERY
    on_mismatch: str = "warn"
    chunk: int = DEFAULT_CHUNK
    timeout_s: float = 60.0
    families: tuple[str, ...] = field(default=FAMILIES)
    inject: str = ""  # a mutant fault to run the job's Gloo groups under (a drill)
    hook: str = "native"  # native: the C++ kernel counts and samples; python: every call in Python
    keep_inputs: int = 0  # keep a sampled call's input of at most this many elements; 0: none


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def sample_rate(text: str) -> int:
    """``--sample``: ``every`` (each call) or N (one call in N), 1 <= N <= 10^9."""
    if text.strip().lower() == "every":
        return 1
    try:
        n = int(text, 10)
    except ValueError:
        raise SettingsError(f"--sample {_short(text)}: give 'every' or a whole number N "
                            "(check one call in N), e.g. --sample 100") from None
    if not 1 <= n <= MAX_EVERY:
        raise SettingsError(f"--sample {n}: N is 1 to {MAX_EVERY}")
    return n


def validate(s: Settings) -> Settings:
    """``s`` itself, or SettingsError naming the first bad setting."""
    if type(s.every) is not int or not 1 <= s.every <= MAX_EVERY:
        raise SettingsError(f"sample {_short(s.every)}: 1 to {MAX_EVERY}")
    if s.on_mismatch not in MODES:
        raise SettingsError(f"--on-mismatch {_short(s.on_mismatch)}: choose one of "
                            f"{', '.join(MODES)}")
    if type(s.chunk) is not int or not 1 <= s.chunk <= MAX_CHUNK:
        raise SettingsError(f"--chunk {_short(s.chunk)}: 1 to {MAX_CHUNK} elements")
    if (not isinstance(s.timeout_s, (int, float)) or isinstance(s.timeout_s, bool)
            or not math.isfinite(s.timeout_s) or not 0.1 <= s.timeout_s <= 3600):
        raise SettingsError(f"--timeout {_short(s.timeout_s)}: 0.1 to 3600 seconds")
    bad = [f for f in s.families if f not in FAMILIES]
    if bad or not s.families:
        raise SettingsError(f"--ops {_short(','.join(map(str, s.families)))}: a comma list of "
                            f"{', '.join(FAMILIES)}")
    if type(s.keep_inputs) is not int or not 0 <= s.keep_inputs <= MAX_KEEP:
        raise SettingsError(f"--keep-inputs {_short(s.keep_inputs)}: 0 (keep none) to "
                            f"{MAX_KEEP} elements")
    if s.hook not in HOOKS:
        raise SettingsError(f"hook {_short(s.hook)}: one of {', '.join(HOOKS)}")
    if s.inject and s.inject not in (*FAULTS, FAITHFUL):
        raise SettingsError(f"--inject {_short(s.inject)}: not a fault of collective-mutate "
                            "(collective-mutate --list-faults lists them)")
    return s


def to_env(s: Settings) -> str:
    """The JSON the ranks read."""
    return json.dumps(asdict(s))


def from_env() -> Settings:
    """The ranks' settings from the environment (SettingsError if malformed)."""
    raw = os.environ.get(ENV, "")
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        raise SettingsError(f"{ENV} is not JSON ({_short(raw)})") from None
    if not isinstance(data, dict) or not set(data) <= set(Settings.__dataclass_fields__):
        raise SettingsError(f"{ENV}: not the guard's settings ({_short(raw)})")
    if "families" in data:
        if not isinstance(data["families"], list):
            raise SettingsError(f"{ENV}: families is not a list")
        data["families"] = tuple(data["families"])
    return validate(Settings(**data))
