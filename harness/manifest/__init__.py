"""A backend's capability manifest: what it claims, what it wraps, and what follows for each
instance.

A backend author declares in a small YAML file (:mod:`.load`) which ops, dtypes, reduce ops and
capabilities the backend supports, and which backend it wraps (``inherits: gloo``). The runner
applies it when it prepares an instance (:mod:`.apply`): the wrapped backend's known behaviours
(the bundled overrides scoped to it) apply and are reported as inherited; an instance that
needs something declared unsupported (:mod:`.needs`) must be rejected with an error on every
rank, and is recorded as unsupported as declared, never as a pass or a failure; what the
manifest claims is held to the contract like any other instance, so a claim the backend
breaks fails. The certificate (:mod:`harness.certify`) reads the result back per cell.

Parent side; no torch.

Must not: import torch, or run anything the manifest says: it is data, read with the
case files' safe loader.
"""
