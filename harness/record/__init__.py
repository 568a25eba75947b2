"""collective-record: turn the collectives a real run issues into case files.

Takes a launch command (``python train.py``, ``torchrun ...``, ``python -m mod``) and runs it
with a recorder injected into every Python process it starts (``site/sitecustomize.py`` on
``PYTHONPATH``, active only where ``COLLECTIVE_RECORD_DIR`` names a folder); each rank writes a
JSON-lines trace of the calls it made (op, group, shapes, strides, dtype, device, reduce op,
roots and peers, async and where it was waited, the user's call site), and the parent merges
the traces into a case file the plugin collects as it is. Also reads torch Flight Recorder
dumps and execution traces (``--from-trace``). Gives: a YAML case file and a one-line summary.
Must not: record tensor contents, change what the recorded program computes, unpickle anything
but plain data (no class or function reference is ever looked up), or drop a call it cannot
translate without saying so.
"""
