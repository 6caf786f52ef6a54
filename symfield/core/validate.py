"""Input validation at the public boundary, with one message format.

    The 'sigma_w2' parameter of q_map must be a finite float >= 0. Got -1.0 instead.

ValueError for bad values, TypeError for bad types.
"""
from __future__ import annotations

import numbers

import mpmath
import numpy as np


def _fmt(value):
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return repr(value.item())
    if isinstance(value, np.ndarray):
        bad = value.ravel()
        return repr(bad[:5].tolist()) + ("..." if bad.size > 5 else "")
    return repr(value)


def fail(func: str, name: str, rule: str, value, exc=ValueError):
    raise exc(f"The '{name}' parameter of {func} must be {rule}. Got {_fmt(value)} instead.")


def real(func: str, name: str, value, *, lo=None, lo_open=False, hi=None):
    """Validate a real scalar or array-like; returns float64 ndarray (or the mpf/scalar kept)."""
    rule = "a finite float"
    if lo is not None:
        rule += f" {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        rule += f" and <= {hi:g}"
    if isinstance(value, (bool, np.bool_)) or isinstance(value, str):
        fail(func, name, rule, value, TypeError)
    if isinstance(value, mpmath.mpf):
        arr = np.asarray(float(value))
    else:
        try:
            arr = np.asarray(value)
        except Exception:
            fail(func, name, rule, value, TypeError)
        if arr.dtype == object:
            try:
                arr = np.asarray(arr.tolist(), dtype=float) if all(
                    isinstance(v, (numbers.Real, mpmath.mpf)) and not isinstance(v, bool)
                    for v in arr.ravel()) else None
            except Exception:
                arr = None
            if arr is None:
                fail(func, name, rule, value, TypeError)
        if arr.dtype.kind not in "iuf":
            fail(func, name, rule, value, TypeError)
        arr = arr.astype(float)
    bad = ~np.isfinite(arr)
    if lo is not None:
        bad |= (arr <= lo) if lo_open else (arr < lo)
    if hi is not None:
        bad |= arr > hi
    if np.any(bad):
        fail(func, name, rule, value if arr.ndim == 0 else arr[bad])
    return arr


def integer(func: str, name: str, value, *, lo=None, hi=None):
    rule = "an integer" + (f" >= {lo}" if lo is not None else "") + (f" and <= {hi}" if hi is not None else "")
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        fail(func, name, rule, value, TypeError)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        fail(func, name, rule, value)
    return int(value)


def dps(func: str, value):
    if value is None:
        return None
    return integer(func, "dps", value, lo=5, hi=1000)


def covariance(func: str, q1, q2, q12):
    """Check |q12| <= sqrt(q1 q2) (with a relative slack of a few ulps)."""
    bound = np.sqrt(q1 * q2)
    bad = np.abs(q12) > bound * (1 + 4e-16)
    if np.any(bad):
        q12b = np.broadcast_to(q12, bad.shape)
        fail(func, "q12", "a covariance with |q12| <= sqrt(q1*q2) (correlation c in [-1, 1])",
             q12b if q12b.ndim == 0 else q12b[bad])


MEMORY_FRACTION = 0.25   # arrays a call allocates up front may use at most this share of physical memory


def memory_limit() -> int:
    """MEMORY_FRACTION of the physical memory, in bytes (8 GiB when the OS does not say)."""
    import os
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        total = 32 << 30
    return int(MEMORY_FRACTION * total)


def memory(func: str, what: str, nbytes):
    """Refuse, before allocating, arrays of ``nbytes`` bytes above :func:`memory_limit` (``what`` says
    which parameters set the size, e.g. "depth = 10**12 stored layers x 1 grid point x 4 arrays x 8 bytes")."""
    limit = memory_limit()
    if nbytes > limit:
        raise ValueError(f"{func} would need {nbytes / 2**30:.3g} GiB for {what}, more than the limit of "
                         f"{limit / 2**30:.3g} GiB ({MEMORY_FRACTION:.0%} of physical memory); reduce them")
