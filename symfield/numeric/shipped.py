"""Tables shipped inside the package (``symfield/data/``), so built-in activations start warm.

The certified tables of :mod:`symfield.numeric.tables` and :mod:`symfield.numeric.table1d` cost seconds
to minutes to build (one quadrature per node). For the built-in activations and pools they are built
once, ahead of time, by ``python -m symfield.reports.ship_tables`` (which certifies every panel as
any build does and then checks each table against independent mpmath quadrature of the defining
integral) and shipped as package data. A process looks in its own cache first, then here.

A shipped file is named by a hash of what it tabulates (the activation's expression, pool, k and the
table parameters), not by the symfield or SymPy version, so a SymPy upgrade does not orphan it.
It carries a sha256 of its arrays and passes the same structure checks as a cached file; a shipped
file that fails them is ignored with one warning (it is never moved or rewritten: the package
directory is read-only to symfield). ``SYMFIELD_SHIPPED=0`` switches shipped tables off (the tests of
the builders use it).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"


def enabled() -> bool:
    """Shipped tables are used unless ``SYMFIELD_SHIPPED`` is "0"."""
    return os.environ.get("SYMFIELD_SHIPPED", "1").strip() != "0"


def key(*parts) -> str:
    """A stable 20-hex-digit name for the lines ``parts``."""
    return hashlib.sha256("\n".join(str(p) for p in parts).encode()).hexdigest()[:20]


def path(folder: str, name: str) -> Path:
    """Where a shipped file of that name lives (whether or not it exists)."""
    return DATA / folder / name


def lookup(folder: str, name: str) -> Path | None:
    """The shipped file, if shipped tables are enabled and it exists."""
    p = path(folder, name)
    return p if enabled() and p.is_file() else None
