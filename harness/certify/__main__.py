"""``python -m harness.certify``: the same as ``collective-certify``."""

from .cli import main

raise SystemExit(main())
