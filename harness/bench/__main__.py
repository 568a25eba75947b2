"""``python -m harness.bench``: the same command as ``collective-bench``."""

from .overhead import main

raise SystemExit(main())
