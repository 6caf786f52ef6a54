"""The ``symfield`` command line: common helpers (common.py), the parser (parser.py), commands (main.py)."""
from symfield.cli.main import main

__all__ = ["main"]
