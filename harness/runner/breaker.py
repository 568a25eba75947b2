"""``--after-hang skip``: after a hang nobody declared, stop sending what hung to the backend.

A backend whose groups never form, or whose op never completes, would otherwise cost the
deadline on every instance that uses it: the torchft trial spent 48 deadlines on one cause.
With the breaker on (a certificate turns it on), an undeclared hang counts against the need it
hung on (the op of the step the ranks were blocked in, or ``capability subgroups`` when they
were blocked before the first step, where the instance's groups are made; ranks blocked
waiting for an async op's Work or future, in a ``wait`` or ``future`` step, hung on that op
*and* ``capability async``: torchft's BabyGloo loses futures held in flight, while its
blocking all_reduce completes, and the op alone would stop every all_reduce); when instances of
two different cases have hung on the same need, it trips, and every later instance that needs
it is skipped with a reason that names the instance that hung, said once per instance (the
certificate files them under the broken cell as blocked, apart from skips); the session says
so in one line when it trips (:meth:`Breaker.news`). Two cases, not
one: a single hang can be the case's own doing (a deliberate mismatch under a debug setting
hung one instance of all_reduce in the torchft trial while every other all_reduce ran). A hang
of an instance with an environment of its own (``env:``) or a planned death counts for
nothing: it is about that setting, not about the op.

Off by default: a conformance report runs everything it collected.
"""

from __future__ import annotations

from .. import ops
from ..manifest import needs
from ..model import Instance, InstanceResult, Step, flat_steps

BLOCKED = "blocked: "  # the skip reason's prefix; the certificate reads it back
MODES = ("run", "skip")
ASYNC: needs.Need = ("capability", "async")
# What an instance hung on: one need, or an op with capability async (an instance is blocked
# when it has every need of a tripped key).
Key = tuple[needs.Need, ...]


def words(key: Key) -> str:
    """``op all_reduce``, ``op all_reduce with capability async``."""
    return " with ".join(f"{kind} {name}" for kind, name in key)


class Breaker:
    """What hung, by need, and the instance it first hung in."""

    def __init__(self, strikes: int = 2) -> None:
        self.strikes = strikes
        self.hung: dict[Key, dict[str, str]] = {}  # key -> case id -> instance key
        self.tripped: dict[Key, str] = {}
        self._unsaid: list[str] = []

    def blocked(self, inst: Instance) -> str:
        """The skip reason of ``inst`` if it needs something that hung before ("" if not)."""
        have = set(needs.of(inst))
        for key, where in list(self.tripped.items()):  # a run ahead asks from its thread
            if all(need in have for need in key):
                return (f"{BLOCKED}{words(key)} hung in {where} (not declared); "
                        "--after-hang skip sends it to this backend no more")
        return ""

    def observe(self, inst: Instance, result: InstanceResult) -> None:
        """Trip what ``inst`` hung on, if it hung where its case did not say it would."""
        if result.outcome != "hang" or inst.expectation.kind == "hangs":
            return
        if inst.env or inst.deaths:
            # A hang under a case's own environment (a debug mode) or after a planned death
            # says something about that setting, not about the op every other case calls.
            return
        key = self._hung_on(inst, result)
        cases = self.hung.setdefault(key, {})
        cases.setdefault(inst.case_id, inst.key)
        if len(cases) >= self.strikes and key not in self.tripped:
            self.tripped[key] = " and ".join(cases.values())
            where = (" while their groups were made" if key == (("capability", "subgroups"),)
                     else "")
            self._unsaid.append(
                f"--after-hang skip: the ranks hung{where} in {len(cases)} cases ("
                f"{self.tripped[key]}), so {words(key)} is sent to this backend no "
                "more: later instances that need it are skipped as blocked")

    def news(self) -> list[str]:
        """The lines not said yet, one per need that tripped: each is said once."""
        out, self._unsaid = self._unsaid, []
        return out

    @staticmethod
    def _hung_on(inst: Instance, result: InstanceResult) -> Key:
        blocked = [s for s in result.states if s.state == "blocked"]
        # Blocked before the first step is where an instance's groups are made; a new_group
        # step makes one too.
        forming = any(s.step < 0 or (s.step < len(inst.steps)
                                     and inst.steps[s.step].kind == "new_group")
                      for s in blocked)
        if forming and ("capability", "subgroups") in needs.of(inst):
            return (("capability", "subgroups"),)
        for s in sorted(blocked, key=lambda s: s.step):
            if not 0 <= s.step < len(inst.steps):
                continue
            step = inst.steps[s.step]
            if step.op:
                return (("op", str(step.op)),)
            waited = _async_op_of(inst, step)
            if waited:
                return (("op", waited), ASYNC)
        return (("op", inst.op),)


def _async_op_of(inst: Instance, step: Step) -> str:
    """The op whose Work ``step`` waits on (a ``wait`` or ``future`` step naming the handle
    of an async op step), "" for any other step."""
    if step.kind not in ("wait", "future"):
        return ""
    for s in flat_steps(inst.steps):
        if (s.kind == "op" and s.op and s.handle in step.waits
                and (s.async_op or s.op in ops.ALWAYS_ASYNC)):
            return str(s.op)
    return ""
