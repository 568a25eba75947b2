"""``python -m harness.record``: the collective-record command."""

from harness.record.cli import main

raise SystemExit(main())
