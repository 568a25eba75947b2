"""``python -m harness.fuzz``: the same as ``collective-fuzz``."""

from .cli import main

raise SystemExit(main())
