"""``python -m harness.external``: see :mod:`harness.external.cli`."""

from .cli import main

raise SystemExit(main())
