"""The start breaker: a process group that cannot start is tried a few times, not per instance.

A backend whose group never starts made every instance try a pool of its own and fail the
same way: when ranks were daemonic, torchft's BabyGloo (which starts a worker process; "daemonic
processes are not allowed to have children") cost 3,223 instances of the bundled suite, 0.85 s
each, 45 minutes of one error. Here, when pools of one family fail to start with the
same cause :data:`STRIKES` times in a row, no pool of that family is started again in the
session: every later instance that needs one is skipped as blocked, with one reason (the same
for all of them) that names the pool, the instances whose starts failed and the error; the
session says so in one line (:meth:`StartBreaker.news`). The instances whose starts failed
stay ``error`` records, so a session with a tripped breaker is never a PASS, and the
certificate counts the blocked instances against its skip budget as well as under their
cells (``harness.certify.cells``).

Always on (unlike ``--after-hang skip``): a start precedes every case, so nothing about any
case is learnt by starting the same pool once more; the error is in every blocked record.

Why these choices:

- A family is the pool key without its isolation number: the backend, device, world size,
  backend modules, the environment and process-group timeout a case sets, the device binding.
  A backend may fail at one world size only (one that needs an even number of ranks, or more
  devices than the machine has), or only under one case's ``env:`` (a debug setting); those
  must not block the pools that start. An isolated instance's private pool is of its family.
- :data:`STRIKES` = 3 in a row: one failure can be the machine's (a port taken, a slow
  rendezvous), and a start that fails and then succeeds is a flaky start, not a dead backend
  (a success empties the streak). Three of the same cause in a row make a coincidence
  unlikely and cost three starts per family: about 3 s for a backend that raises at once, or
  three startup timeouts for a rendezvous that never completes.
- One family stopped for a cause is evidence about the backend: another family of the same
  backend and device whose start then fails with that cause is stopped at its first failure.
  Otherwise a rendezvous that never completes would cost three startup timeouts in each of
  the bundled library's 20 families (two hours at 120 s), where the first three were enough.
  A family that starts is never stopped by another's failures.
- "The same cause": what the ranks said, with numbers and addresses made alike (which rank
  failed first, a pid or a port changes from one try to the next); a try continues the streak
  when it shares a cause with every try before it in the streak. A different error starts a
  new streak.

Thread-safe: runs made ahead of their turn (harness.plugin.ahead) start pools from threads.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field, replace

from ..report.jsonfile import printable
from ..run.pool import PoolKey, PoolStartError

STRIKES = 3
BLOCKED = "blocked: pool start: "  # the skip reason's prefix (harness.certify.cells reads it)
NEWS = "pool start: "  # the session's one line, after "collective-harness: "
ERROR_CHARS = 300  # of the error quoted in a reason: one line, however long the rank's tail

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")


def cause(text: str) -> str:
    """``text`` with what changes from one try to the next made alike (numbers, addresses)."""
    text = _NUMBER.sub("#", _ADDRESS.sub("0x#", text))
    return _SPACE.sub(" ", text).strip()[:500]


@dataclass
class Streak:
    """The failed starts in a row of one family, and the causes all of them share."""

    causes: frozenset[str]
    instances: list[str] = field(default_factory=list)
    error: str = ""  # the last try's first rank error, as the ranks said it


def family(key: PoolKey) -> PoolKey:
    """The key every pool of ``key``'s family shares (an isolated pool's is the shared one's)."""
    return replace(key, isolated=0)


def pool_words(key: PoolKey) -> str:
    """``the gloo process group of 2 rank(s) on cpu`` (with its environment, when it has one)."""
    env = (" with " + " ".join(f"{k}={v}" for k, v in key.env)) if key.env else ""
    # A case's env: values are the case file's text: escaped, and bounded, in a one-line reason.
    return printable(f"the {key.backend} process group of {key.world_size} rank(s) on "
                     f"{key.device}{env}", 300)


class StartBreaker:
    """Failed starts by family; the reason of each family that tripped."""

    def __init__(self, strikes: int = STRIKES) -> None:
        self.strikes = strikes
        self.streaks: dict[PoolKey, Streak] = {}
        self.tripped: dict[PoolKey, str] = {}
        self.counted: dict[PoolKey, frozenset[str]] = {}  # the instances that tripped it
        # The causes that stopped a family, by (backend, device, backend modules).
        self.dead: dict[tuple[str, str, tuple[str, ...]], tuple[frozenset[str], str]] = {}
        self._unsaid: list[str] = []
        self._lock = threading.Lock()

    def blocked(self, key: PoolKey, instance: str = "") -> str:
        """The skip reason of ``instance``, which needs a pool of ``key``'s family ("" if its
        pools still start, or once if ``instance`` is one whose failed start tripped it: a run
        ahead of its turn may trip the breaker before its item is reached, and that item's
        record is its error; once, since the fuzzer runs many documents under one key)."""
        fam = family(key)
        with self._lock:
            counted = self.counted.get(fam, frozenset())
            if instance and instance in counted:
                self.counted[fam] = counted - {instance}
                return ""
            return self.tripped.get(fam, "")

    def started(self, key: PoolKey) -> None:
        """A pool of ``key``'s family is running: whatever failed before was not the backend."""
        with self._lock:
            self.streaks.pop(family(key), None)

    def failed(self, key: PoolKey, exc: PoolStartError, instance: str) -> None:
        """A pool of ``key``'s family did not start for ``instance``; trip after
        :attr:`strikes` tries in a row with a cause in common."""
        said = exc.causes or (str(exc),)
        causes = frozenset(cause(c) for c in said)
        fam = family(key)
        with self._lock:
            if fam in self.tripped:
                return
            streak = self.streaks.get(fam)
            if streak is None or not (streak.causes & causes):
                streak = self.streaks[fam] = Streak(causes)
            streak.causes &= causes
            streak.instances.append(instance)
            streak.error = printable(said[0], ERROR_CHARS)
            backend = (fam.backend, fam.device, fam.backend_modules)
            known, stopped = self.dead.get(backend, (frozenset(), ""))
            names = [printable(i, 200) for i in streak.instances]
            if known & streak.causes:
                what = (f"{pool_words(fam)} could not start ({names[-1]}) with the error that "
                        f"stopped {stopped}: {streak.error}")
            elif len(streak.instances) < self.strikes:
                return
            else:
                which = ", ".join(names[:-1]) + " and " + names[-1]
                what = (f"{pool_words(fam)} could not start {len(streak.instances)} times in "
                        f"a row with the same error ({which}): {streak.error}")
                self.dead[backend] = (known | streak.causes, pool_words(fam))
            self.tripped[fam] = f"{BLOCKED}{what}; no such pool is started again"
            self.counted[fam] = frozenset(streak.instances)
            self._unsaid.append(f"{NEWS}{what}; no such pool is started again this session: "
                                "later instances that need one are skipped as blocked")

    def news(self) -> list[str]:
        """The lines not said yet, one per family that tripped: each is said once."""
        with self._lock:
            out, self._unsaid = self._unsaid, []
        return out
