"""A manifest proposed from the probes (``data/probes.yaml``), for a backend that came
without one: each probe that passed claims its op or capability; each one that did not is
declared unsupported, with what happened as the reason. It is a starting point to review,
never a declaration: a certificate run on it says so and is not above level ``none``."""

from __future__ import annotations

from typing import Any

import yaml

from ..manifest.load import CAPABILITIES

# Probes named after a capability rather than an op.
CAPABILITY_PROBES = ("async", "subgroups")


def manifest_text(backend: str, modules: list[str], probes: dict[str, Any] | None) -> str:
    """The proposed manifest, as YAML text with a comment on where it came from."""
    ok: list[str] = []
    off: dict[str, str] = {}
    for rec in (probes or {}).get("records", []):
        name = str(rec["case"])
        if rec["outcome"] == "passed":
            ok.append(name)
        else:
            first = str(rec.get("message", "")).splitlines()
            off[name] = f"probe {rec['id']}: {rec['outcome']}" + (
                f" ({first[1].strip()[:160]})" if len(first) > 1 else "")
    doc: dict[str, Any] = {"backend": backend}
    if modules:
        doc["module"] = modules[0]
    ops = sorted(n for n in ok if n not in CAPABILITY_PROBES)
    supports: dict[str, Any] = {"ops": ops}
    for cap in CAPABILITY_PROBES:
        if cap in off and cap in CAPABILITIES:
            supports[cap] = False
    doc["supports"] = supports
    if off:
        doc["reasons"] = dict(sorted(off.items()))
    head = ("# Proposed by collective-certify from one probe per op (harness/certify/data/"
            "probes.yaml).\n# Review it: claim what the backend is meant to support, declare "
            "what it is not,\n# and pass it with --manifest. Everything not listed is claimed.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=100)
