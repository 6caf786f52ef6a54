"""Scalar helpers that printed closed forms call inside compiled code (:class:`symfield.numeric.codegen.NumbaPrinter`).

``_gram_sqrt(q1, q2, q12)`` = sqrt(q1 q2 - q12^2) (the arc-cosine kernels' sin(theta) sqrt(q1 q2)) clamped at 0
and scaled by an exact power of two when q is huge or tiny, so q1*q2 cannot overflow (|q| up to ~1e308)
or underflow: the same rounding as the direct formula, and exactly 0 at c = 1.
``_sin_minus_tcos(t)`` = sin t - t cos t, by its Taylor series sum_k (-1)^(k+1) 2k t^(2k+1)/(2k+1)! for
|t| < 0.5 (no cancellation). (The NumPy path of lambdified closed forms has a vectorised version,
symfield.numeric.evaluate.sin_minus_tcos, because lambdify calls it on arrays.)
"""
from __future__ import annotations

import math

import numpy as np

from symfield.numeric.kernels.jit import OPTS, njit

# ---- compiled ----
_FACT = np.array([math.factorial(i) for i in range(26)], dtype=np.float64)


@njit(**OPTS)
def _gram_sqrt(q1, q2, q12):
    m = max(abs(q1), abs(q2), abs(q12))
    if 1e-150 < m < 1e150 or m == 0.0 or not math.isfinite(m):
        return math.sqrt(max(q1 * q2 - q12 * q12, 0.0))
    e = math.frexp(m)[1]
    a = math.ldexp(q1, -e)
    b = math.ldexp(q2, -e)
    c = math.ldexp(q12, -e)
    return math.ldexp(math.sqrt(max(a * b - c * c, 0.0)), e)


@njit(**OPTS)
def _sin_minus_tcos(t):
    if abs(t) >= 0.5:
        return math.sin(t) - t * math.cos(t)
    t2 = t * t
    s = 0.0
    for k in range(12, 0, -1):
        s = s * t2 + (1.0 if k % 2 == 1 else -1.0) * 2.0 * k / _FACT[2 * k + 1]
    return s * t2 * t
