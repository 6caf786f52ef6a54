"""Vectorised bracketed root finding (one call refines many independent brackets at once)."""
from __future__ import annotations

import numpy as np


def vroot(f, lo, hi, flo, fhi, rtol=4e-16, maxiter=200):
    """Roots of f on the brackets [lo, hi] (flo = f(lo), fhi = f(hi) of opposite signs or zero).

    ``f(x, idx)`` evaluates the function of problem ``idx`` (integer index array) at ``x``.
    Illinois false position, with a bisection on every third step where the last three steps did not
    halve the bracket: superlinear on smooth f, never much slower than bisection. Stops when the
    bracket is below rtol * |x| (or f = 0)."""
    lo, hi = np.array(lo, float), np.array(hi, float)
    flo, fhi = np.array(flo, float), np.array(fhi, float)
    x = np.where(flo == 0, lo, np.where(fhi == 0, hi, np.nan))
    active = np.isnan(x)
    keep = np.zeros(lo.shape, np.int8)  # +1: lo kept last step, -1: hi kept (Illinois halving)
    width = np.abs(hi - lo)              # bracket width three steps ago (the bisection guard)
    for it in range(maxiter):
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            break
        a, b, fa, fb = lo[idx], hi[idx], flo[idx], fhi[idx]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            m = (a * fb - b * fa) / (fb - fa)
        mid = 0.5 * (a + b)
        slow = np.zeros(idx.shape, bool)
        if it % 3 == 2:                  # the last three steps did not halve the bracket: bisect
            slow = np.abs(b - a) > 0.5 * width[idx]
            width[idx] = np.where(slow, 0.5 * np.abs(b - a), np.abs(b - a))
        m = np.where(np.isfinite(m) & (m > a) & (m < b) & ~slow, m, mid)
        fm = np.asarray(f(m, idx), float)
        same = np.sign(fm) == np.sign(fa)  # root in [m, b]
        k = keep[idx]
        new_fb = np.where(same & (k == -1), 0.5 * fb, fb)
        new_fa = np.where(~same & (k == 1), 0.5 * fa, fa)
        lo[idx] = np.where(same, m, a)
        flo[idx] = np.where(same, fm, new_fa)
        hi[idx] = np.where(same, b, m)
        fhi[idx] = np.where(same, new_fb, fm)
        keep[idx] = np.where(same, -1, 1)
        done = (fm == 0) | (np.abs(hi[idx] - lo[idx]) <= rtol * np.maximum(np.abs(lo[idx]), np.abs(hi[idx])))
        x[idx[done]] = np.where(fm[done] == 0, m[done], 0.5 * (lo[idx[done]] + hi[idx[done]]))
        active[idx[done]] = False
    rest = np.isnan(x)
    x[rest] = 0.5 * (lo[rest] + hi[rest])
    return x
