"""The process's memo tables, registered in one place so they can be cleared together.

Every in-process cache that holds state -- tables, maps-engine objects, spent quadrature time,
compiled-module handles' data -- is created through :func:`memo` or :func:`lru`, and :func:`clear`
empties all of them: what follows then sees only the disk cache, exactly as a new process would.
Caches of pure symbolic derivations (``functools.lru_cache`` on functions of SymPy expressions) are
left out: their values never depend on what ran before, only how long a later call takes. The test suite clears them between test modules, so
no test depends on state another left behind; a long-lived session may call it after changing
``SYMFIELD_CACHE`` or ``SYMFIELD_SHIPPED``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

_REGISTRY: list = []


def memo() -> dict:
    """A new module-level memo dict, cleared by :func:`clear`."""
    d: dict = {}
    _REGISTRY.append(d)
    return d


def lru(maxsize: int | None = 128) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``functools.lru_cache(maxsize)``, cleared by :func:`clear`."""
    def wrap(fn):
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _REGISTRY.append(cached)
        return cached
    return wrap


def clear() -> None:
    """Empty every registered cache (as in a new process; the disk cache is left as it is)."""
    for c in _REGISTRY:
        if isinstance(c, dict):
            c.clear()
        else:
            c.cache_clear()


def count() -> int:
    """How many caches are registered (for tests and diagnostics)."""
    return len(_REGISTRY)
