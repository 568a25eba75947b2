"""A manifest proposed from the probes (``data/probes.yaml``), for a backend that came
without one. Each probe that passed claims the ops its instance issues (a capability probe,
its capability); each one that did not declares them unsupported, with what happened as the
reason. An op no probe issued, or whose probe was skipped (a torch without it), is claimed,
as everything a manifest leaves unsaid is, and the proposal names each such op as not
probed, never silently. It is a starting point to review, never a declaration: a
certificate run on it says so and is not above level ``none``.
"""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from .. import ops
from ..casefile import collect
from ..manifest import needs
from ..manifest.load import CAPABILITIES

# Probes named after a capability rather than an op.
CAPABILITY_PROBES = ("async", "subgroups")


def probe_ops(path: str) -> dict[str, tuple[str, ...]]:
    """The ops each probe of the probe file at ``path`` issues, by probe (case) name."""
    out: dict[str, tuple[str, ...]] = {}
    for inst in collect.from_file(path, "probe"):
        issued = tuple(item for kind, item in needs.of(inst) if kind == "op")
        out[inst.case] = tuple(dict.fromkeys(out.get(inst.case, ()) + issued))
    return out


def manifest_text(backend: str, modules: list[str], probes: dict[str, Any] | None,
                  issued: dict[str, tuple[str, ...]]) -> str:
    """The proposed manifest, as YAML text with comments on where it came from and on the
    ops no probe issued. ``issued``: the ops of each probe (:func:`probe_ops`)."""
    passed: set[str] = set()
    failed: dict[str, str] = {}  # an op or capability -> why it is declared unsupported
    for rec in (probes or {}).get("records", []):
        name = str(rec["case"])
        items = (name,) if name in CAPABILITY_PROBES else issued.get(name, (name,))
        if rec["outcome"] == "passed":
            passed.update(items)
            continue
        if rec["outcome"] == "skipped":  # not run here (a torch without the op): not probed
            continue
        first = str(rec.get("message", "")).splitlines()
        why = f"probe {rec['id']}: {rec['outcome']}" + (
            f" ({first[1].strip()[:160]})" if len(first) > 1 else "")
        for item in items:
            failed.setdefault(item, why)
    # An op one probe refused and another issued fine is not claimed: a claim must hold.
    unprobed = sorted(set(ops.ALL_OPS) - passed - set(failed))
    claimed = sorted((passed | set(unprobed)) - set(failed) - set(CAPABILITY_PROBES))
    doc: dict[str, Any] = {"backend": backend}
    if modules:
        doc["module"] = modules[0]
    supports: dict[str, Any] = {"ops": claimed}
    for cap in CAPABILITY_PROBES:
        if cap in failed and cap in CAPABILITIES:
            supports[cap] = False
    doc["supports"] = supports
    if failed:
        doc["reasons"] = dict(sorted(failed.items()))
    head = ("# Proposed by collective-certify from one probe per op (harness/certify/data/"
            "probes.yaml).\n# Review it: claim what the backend is meant to support, declare "
            "what it is not,\n# and pass it with --manifest. An op not under ops: is "
            "declared unsupported;\n# a capability left out is claimed.\n")
    if unprobed:
        head += "".join(f"# {line}\n" for line in textwrap.wrap(
            "Not probed, claimed unverified (the library will tell): " + ", ".join(unprobed),
            96))
    elif probes is not None:
        head += "# Every op of the op table was probed.\n"
    if probes is None:
        head += "# The probes wrote no report: nothing was probed.\n"
    return head + yaml.safe_dump(doc, sort_keys=False, width=100)
