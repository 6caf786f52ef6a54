"""Scalar helpers that printed closed forms call inside compiled code (:class:`symfield.numeric.codegen.NumbaPrinter`).

``_gram_sqrt(q1, q2, q12)`` = sqrt(q1 q2 - q12^2) (the arc-cosine kernels' sin(theta) sqrt(q1 q2)) clamped at 0
and scaled by an exact power of two (2^-600 beyond 1e150, 2^600 below 1e-150; selected without a branch, so loops
of it vectorise), so q1*q2 cannot overflow (|q| up to ~1e308) or underflow: the same rounding as the direct
formula, and exactly 0 at c = 1.
``_sin_minus_tcos(t)`` = sin t - t cos t, by its Taylor series sum_k (-1)^(k+1) 2k t^(2k+1)/(2k+1)! for
|t| < 0.5 (no cancellation). (The NumPy path of lambdified closed forms has a vectorised version,
symfield.numeric.evaluate.sin_minus_tcos, because lambdify calls it on arrays.)

``_atan2(y, x)``, ``_atan(x)``, ``_asin(x)``, ``_acos(x)``: the inverse tangent family without a branch or a call,
so that LLVM vectorises the loops that evaluate closed-form maps (libm's atan2 is a scalar call of ~15 ns).
Range reduction: t = min(|x|, |y|)/max(|x|, |y|) in [0, 1], and u = (t - 1)/(t + 1) in [-tan(pi/8), 0] where
t > tan(pi/8) (formed as (min - max)/(min + max), one division either way), so |u| <= tan(pi/8) and
atan(u) = u + u z p(z), z = u^2, with p of degree 9 (ATAN_P: the weighted least-squares fit of
(atan(sqrt z)/sqrt z - 1)/z on [0, tan(pi/8)^2], relative error of atan(u), at 50 digits; about 1 ulp);
then atan(t) = atan(u) + pi/4, pi/2 - . where |y| > |x|, pi - . where x < 0, and the sign of y.
atan2(0, 0) = 0, NaN in gives NaN. asin(x) = atan2(x, sqrt((1 - x)(1 + x))) and acos(x) = atan2(sqrt((1 - x)(1 + x)), x)
(1 - x is exact near x = 1): NaN for |x| > 1, like math.asin without the exception.
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
    big = m > 1e150
    small = m < 1e-150
    f = 2.0 ** -600 if big else (2.0 ** 600 if small else 1.0)     # exact scalings, no branch:
    g = 2.0 ** 600 if big else (2.0 ** -600 if small else 1.0)     # sqrt((q1 f)(q2 f) - (q12 f)^2) = f sqrt(...)
    a = q1 * f
    b = q2 * f
    c = q12 * f
    return math.sqrt(max(a * b - c * c, 0.0)) * g


@njit(**OPTS)
def _sin_minus_tcos(t):
    if abs(t) >= 0.5:
        return math.sin(t) - t * math.cos(t)
    t2 = t * t
    s = 0.0
    for k in range(12, 0, -1):
        s = s * t2 + (1.0 if k % 2 == 1 else -1.0) * 2.0 * k / _FACT[2 * k + 1]
    return s * t2 * t


ATAN_P = (-0.3333333333332994, 0.19999999999045864, -0.1428571419207847, 0.11111106535172005,
          -0.09090779880653867, 0.07690035277550131, -0.06640854043233917, 0.056912305655217224,
          -0.04355541852466736, 0.021218777959480538)
TAN_PI8 = 0.41421356237309503     # tan(pi/8)


@njit(**OPTS)
def _atan2(y, x):
    ax = abs(x)
    ay = abs(y)
    swap = ay > ax
    hi = ay if swap else ax
    lo = ax if swap else ay
    big = lo > TAN_PI8 * hi
    num = lo - hi if big else lo
    den = lo + hi if big else hi
    u = 0.0 if den == 0.0 else num / den
    z = u * u
    s = ATAN_P[9]
    s = s * z + ATAN_P[8]
    s = s * z + ATAN_P[7]
    s = s * z + ATAN_P[6]
    s = s * z + ATAN_P[5]
    s = s * z + ATAN_P[4]
    s = s * z + ATAN_P[3]
    s = s * z + ATAN_P[2]
    s = s * z + ATAN_P[1]
    s = s * z + ATAN_P[0]
    r = u + u * (z * s)
    r = r + 0.7853981633974483 if big else r
    r = 1.5707963267948966 - r if swap else r
    r = 3.141592653589793 - r if x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0) else r
    return -r if y < 0.0 or (y == 0.0 and math.copysign(1.0, y) < 0.0) else r


@njit(**OPTS)
def _atan(x):
    return _atan2(x, 1.0)


@njit(**OPTS)
def _asin(x):
    return _atan2(x, math.sqrt((1.0 - x) * (1.0 + x)))


@njit(**OPTS)
def _acos(x):
    return _atan2(math.sqrt((1.0 - x) * (1.0 + x)), x)
