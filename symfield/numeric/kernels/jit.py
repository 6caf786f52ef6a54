"""A jit-or-identity shim: kernel modules decorate with ``njit`` from here and run as plain Python;
the generated modules that copy them import numba's ``njit`` and ``prange`` instead."""
from __future__ import annotations

OPTS = dict(cache=True, fastmath=False, error_model="numpy")


def njit(*args, **kwargs):
    """Identity stand-in for ``numba.njit`` (bare or with options)."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f


prange = range
