"""collective-harness: a declarative conformance harness for torch.distributed collectives.

The package is split into one module per pipeline stage (see DESIGN.md):
``yamlload`` -> ``validate`` -> ``expand`` -> ``pool``/``rank``/``program`` -> ``verdict`` ->
``report``. Nothing imported at package import time touches torch; only code that runs inside
rank processes (and the parent at run time, lazily) does.
"""

__version__ = "0.1.0"
