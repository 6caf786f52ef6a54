"""Fixed points of the variance map, by bracketing root finding (never by iterating the map).

    q* solves g(q) = sigma_w2 V(q) + sigma_b2 - q = 0,

the first root above 0 in the direction the recursion moves from small q (the fixed point
that the layer recursion reaches and that is stable from below). q* = 0 when sigma_b2 = 0 and
g < 0 just above 0; q* = inf when g > 0 on the whole bracket (the variance grows without bound,
e.g. ReLU with sigma_w2 > 2).
"""
from __future__ import annotations

import math

import mpmath
import numpy as np

from . import validate as check
from .gaussian import q as Q
from .kernel import kernel
from .numeric import evaluate, to_mpf

Q_MIN, Q_MAX = 1e-12, 1e12


def _q_star_scalar(K, sw, sb, dps):
    def g(qv):
        return sw * evaluate(K.V, (Q,), (qv,), K.kinks, dps) + sb - qv

    if dps is None:
        lo = Q_MIN
        glo = float(g(lo))
        if glo <= 0:
            return 0.0 if sb == 0 else math.nan
        hi = max(2 * (sb + sw), 1.0)
        while float(g(hi)) > 0:
            hi *= 4
            if hi > Q_MAX:
                return math.inf
        from scipy.optimize import brentq
        return brentq(lambda t: float(g(t)), lo, hi, xtol=1e-300, rtol=8.9e-16, maxiter=500)
    with mpmath.workdps(dps + 10):
        sw, sb = to_mpf(sw), to_mpf(sb)  # decimal reading, as numeric.evaluate
        lo = mpmath.mpf(Q_MIN)
        if g(lo) <= 0:
            return mpmath.mpf(0) if sb == 0 else mpmath.nan
        hi = max(2 * (sb + sw), mpmath.mpf(1))
        while g(hi) > 0:
            hi *= 4
            if hi > Q_MAX:
                return mpmath.inf
        root = mpmath.findroot(g, (lo, hi), solver="anderson", tol=mpmath.mpf(10) ** (-2 * dps))
        resid = abs(g(root))
        if resid > mpmath.mpf(10) ** (-dps) * max(1, abs(root)):
            raise ArithmeticError(f"q_star: residual {mpmath.nstr(resid, 3)} exceeds the required "
                                  f"{mpmath.nstr(mpmath.mpf(10) ** -dps, 3)} (dps={dps})")
    with mpmath.workdps(dps):
        return +root


def q_star(act, sigma_w2, sigma_b2, dps=None):
    """The variance fixed point q* (float64 arrays broadcast; dps=N gives mpmath numbers)."""
    K = kernel(act)
    dps = check.dps("q_star", dps)
    sw = check.real("q_star", "sigma_w2", sigma_w2, lo=0)
    sb = check.real("q_star", "sigma_b2", sigma_b2, lo=0)
    sw, sb = np.broadcast_arrays(sw, sb)
    out = np.empty(sw.shape, dtype=float if dps is None else object)
    for idx in np.ndindex(sw.shape):
        out[idx] = _q_star_scalar(K, float(sw[idx]), float(sb[idx]), dps)
    return out if out.ndim else out.item()
