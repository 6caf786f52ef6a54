"""Tables shipped inside the package (``symfield/data/``), so built-in activations start warm.

The certified tables of :mod:`symfield.numeric.tables` and :mod:`symfield.numeric.table1d` of the
built-in activations and pools are built ahead of time by ``python -m symfield.reports.ship_tables``
(which certifies every panel as any build does, then checks each table against independent mpmath
quadrature) and shipped as package data; a process looks in its own cache first, then here.

A shipped file is named by a hash of what it tabulates, not by a version. It is read only if
``data/MANIFEST.json`` lists its sha256 and its bytes match (:func:`sha256`, checked by
core.files.load_checked_npz before parsing); one that fails is ignored with one warning, never moved or
rewritten. ``SYMFIELD_SHIPPED=0`` switches shipped tables off. docs/numerics.md sections 3 and 9.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from symfield.core.files import CacheError
from symfield.core import caches

DATA = Path(__file__).resolve().parent.parent / "data"
MANIFEST = "MANIFEST.json"
_MANIFESTS: dict = caches.memo()    # data directory -> {relative path: sha256}


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


def sha256(p) -> str:
    """The sha256 that ``MANIFEST.json`` records for the shipped file ``p`` (CacheError if it is not listed)."""
    p = Path(p)
    data = p.parent.parent
    if data not in _MANIFESTS:
        try:
            entries = json.loads((data / MANIFEST).read_text())
            _MANIFESTS[data] = {rel: str(e["sha256"]) for rel, e in entries.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise CacheError(f"no readable {MANIFEST} beside it ({type(err).__name__}: {err})") from None
    want = _MANIFESTS[data].get(f"{p.parent.name}/{p.name}")
    if want is None:
        raise CacheError(f"not listed in {MANIFEST}")
    return want
