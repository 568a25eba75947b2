"""``--after-hang skip``: after a hang nobody declared, stop sending what hung to the backend.

A backend whose groups never form, or whose op never completes, would otherwise cost the
deadline on every instance that uses it: the torchft trial spent 48 deadlines on one cause.
With the breaker on (a certificate turns it on), an undeclared hang counts against the need it
hung on (the op of the step the ranks were blocked in, or ``capability subgroups`` when they
were blocked before the first step, where the instance's groups are made); when instances of
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

from ..manifest import needs
from ..model import Instance, InstanceResult

BLOCKED = "blocked: "  # the skip reason's prefix; the certificate reads it back
MODES = ("run", "skip")


class Breaker:
    """What hung, by need, and the instance it first hung in."""

    def __init__(self, strikes: int = 2) -> None:
        self.strikes = strikes
        self.hung: dict[needs.Need, dict[str, str]] = {}  # need -> case id -> instance key
        self.tripped: dict[needs.Need, str] = {}
        self._unsaid: list[str] = []

    def blocked(self, inst: Instance) -> str:
        """The skip reason of ``inst`` if it needs something that hung before ("" if not)."""
        for need in needs.of(inst):
            if need in self.tripped:
                return (f"{BLOCKED}{need[0]} {need[1]} hung in {self.tripped[need]} (not "
                        "declared); --after-hang skip sends it to this backend no more")
        return ""

    def observe(self, inst: Instance, result: InstanceResult) -> None:
        """Trip what ``inst`` hung on, if it hung where its case did not say it would."""
        if result.outcome != "hang" or inst.expectation.kind == "hangs":
            return
        if inst.env or inst.deaths:
            # A hang under a case's own environment (a debug mode) or after a planned death
            # says something about that setting, not about the op every other case calls.
            return
        need = self._hung_on(inst, result)
        cases = self.hung.setdefault(need, {})
        cases.setdefault(inst.case_id, inst.key)
        if len(cases) >= self.strikes and need not in self.tripped:
            self.tripped[need] = " and ".join(cases.values())
            where = (" while their groups were made" if need == ("capability", "subgroups")
                     else "")
            self._unsaid.append(
                f"--after-hang skip: the ranks hung{where} in {len(cases)} cases ("
                f"{self.tripped[need]}), so {need[0]} {need[1]} is sent to this backend no "
                "more: later instances that need it are skipped as blocked")

    def news(self) -> list[str]:
        """The lines not said yet, one per need that tripped: each is said once."""
        out, self._unsaid = self._unsaid, []
        return out

    @staticmethod
    def _hung_on(inst: Instance, result: InstanceResult) -> needs.Need:
        blocked = [s for s in result.states if s.state == "blocked"]
        # Blocked before the first step is where an instance's groups are made; a new_group
        # step makes one too.
        forming = any(s.step < 0 or (s.step < len(inst.steps)
                                     and inst.steps[s.step].kind == "new_group")
                      for s in blocked)
        if forming and ("capability", "subgroups") in needs.of(inst):
            return ("capability", "subgroups")
        for s in sorted(blocked, key=lambda s: s.step):
            if 0 <= s.step < len(inst.steps) and inst.steps[s.step].op:
                return ("op", str(inst.steps[s.step].op))
        return ("op", inst.op)
