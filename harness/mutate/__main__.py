"""``python -m harness.mutate``: the same as ``collective-mutate``."""

from .cli import main

raise SystemExit(main())
