"""``python -m harness.gate``: the same as ``collective-gate``."""

from .cli import main

raise SystemExit(main())
