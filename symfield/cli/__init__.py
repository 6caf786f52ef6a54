"""The ``symfield`` command line: shared helpers (common.py), the parser (parser.py), the commands
(main.py; ``sweep`` and ``bench`` in sweep.py and bench.py)."""
from symfield.cli.main import main

__all__ = ["main"]
