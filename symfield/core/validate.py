"""Input validation at the public boundary, with one message format.

    The 'sigma_w2' parameter of q_map must be a finite float >= 0. Got -1.0 instead.

InvalidValue (a ValueError) for bad values, InvalidType (a TypeError) for bad types.
"""
from __future__ import annotations

import numbers

import mpmath
import numpy as np

from symfield.core.errors import InvalidType, InvalidValue


def _fmt(value):
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return repr(value.item())
    if isinstance(value, np.ndarray):
        bad = value.ravel()
        return repr(bad[:5].tolist()) + ("..." if bad.size > 5 else "")
    return repr(value)


_OURS = {ValueError: InvalidValue, TypeError: InvalidType}


def fail(func: str, name: str, rule: str, value, exc=ValueError):
    """Raise ``exc`` (ValueError -> InvalidValue, TypeError -> InvalidType) in the one message format."""
    raise _OURS.get(exc, exc)(f"The '{name}' parameter of {func} must be {rule}. Got {_fmt(value)} instead.")


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


GRAM_SLACK = 4e-16     # relative rounding allowance of |qab| <= sqrt(qa qb) (a few ulps)


def input_gram(func: str, name: str, value, *, pair: bool = True):
    """The one validator of input Gram matrices (norms |x|^2/n0 and overlaps x_a.x_b/n0).

    ``pair=True``: a scalar q (read as (q, q, 0)) or three numbers (qa, qb, qab) with qa, qb finite
    and > 0 and |qab| <= sqrt(qa qb) (1 + GRAM_SLACK); returns (qa, qb, qab) as floats (mpmath numbers are
    returned as given, so a dps= computation can take them exactly).
    ``pair=False``: one input, a scalar norm q > 0; returns q (float, or the mpf given).
    TypeError for what is not real numbers of the right count, ValueError for values outside."""
    rule = ("(qa, qb, qab): two input norms qa, qb > 0 and an overlap |qab| <= sqrt(qa*qb), or one norm q > 0"
            if pair else "a finite float > 0 (an input norm |x|^2/n0)")
    if isinstance(value, (str, bytes, bool, np.bool_)):
        fail(func, name, rule, value, TypeError)
    try:
        arr = np.asarray(value, dtype=object)
    except Exception:
        fail(func, name, rule, value, TypeError)
    if arr.ndim == 0 and pair:
        arr = np.array([arr.item(), arr.item(), 0.0], dtype=object)
    if (arr.shape != ((3,) if pair else ())) or not all(
            isinstance(v, (numbers.Real, mpmath.mpf)) and not isinstance(v, (bool, np.bool_)) for v in arr.ravel()):
        fail(func, name, rule, value, TypeError)
    given = [v if isinstance(v, mpmath.mpf) else float(v) for v in arr.ravel()]
    vals = [float(v) for v in given]
    if not all(np.isfinite(vals)):
        fail(func, name, rule + " (finite)", value)
    if not pair:
        if vals[0] <= 0:
            fail(func, name, rule, value)
        return given[0]
    qa, qb, qab = vals
    if qa <= 0 or qb <= 0:
        fail(func, name, f"{rule}; the norms qa = {qa!r}, qb = {qb!r} must be > 0", value)
    if abs(qab) > np.sqrt(qa * qb) * (1 + GRAM_SLACK):
        fail(func, name, f"{rule}; here sqrt(qa*qb) = {float(np.sqrt(qa * qb))!r} (correlation in [-1, 1])", value)
    return tuple(given)


def variances_in_range(func: str, name: str, value, K, what="K"):
    """Refuse (naming ``name`` = ``value``) a recursion whose layer variances ``K`` (float64, layer 1 first)
    leave float64's normal range: below 2.2e-308 the maps are evaluated at 0 or lose every digit."""
    K = np.asarray(K, dtype=float)
    bad = np.flatnonzero(~(K >= np.finfo(float).tiny))
    if bad.size:
        l = int(bad[0])
        fail(func, name, f"such that every layer variance stays a normal float64 ({what}^({l + 1}) = {float(K[l])!r} "
                         "underflows here; use dps=N for mpmath, or larger variances)", value)


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
        raise InvalidValue(f"{func} would need {nbytes / 2**30:.3g} GiB for {what}, more than the limit of "
                         f"{limit / 2**30:.3g} GiB ({MEMORY_FRACTION:.0%} of physical memory); reduce them")
