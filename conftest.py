"""Checkout-only glue: load the plugin when the package is not installed (pip install -e .
registers it through the pytest11 entry point instead)."""

from importlib import metadata

try:
    metadata.distribution("collective-harness")
except metadata.PackageNotFoundError:
    pytest_plugins = ["harness.plugin"]
