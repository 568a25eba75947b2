"""Certify a backend: identity first, then the library against its manifest, then one verdict.

``collective-certify`` (:mod:`.cli`) runs three ordinary pytest sessions of the harness, so a
certificate rests on the same runner and verdicts as every report: the identity probes
(``data/identity.yaml``: rank and size agree with the launch, the backend's name, a barrier, a
one-element all_reduce, a subgroup forms), the case library against the backend with its
capability manifest (:mod:`harness.manifest`) and ``--after-hang skip``, and the same library
on the reference backend (or a reference report given). :mod:`.cells` reads the reports back
into cells (op x dtype x capability), each conforming, an inherited or own divergence,
unsupported as declared, or a broken promise; groups the failures by cause, identity first;
and decides the level: ``conforming``, ``declared`` (own declared divergences) or ``none``
(anything broken, an identity failure, an incomplete session, or more skips than the budget).
:mod:`.render` writes it for a person.

Must not: judge an instance itself (every verdict is a session's), or be more positive than
the reports it reads: an incomplete or missing session is never a certificate.
"""
