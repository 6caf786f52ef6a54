"""Vectorised bracketed root finding (one call refines many independent brackets at once)."""
from __future__ import annotations

import numpy as np


def vroot(f, lo, hi, flo, fhi, rtol=4e-16, maxiter=200):
    """Roots of f on the brackets [lo, hi] (flo = f(lo), fhi = f(hi) of opposite signs or zero; lo > hi allowed).

    ``f(x, idx)`` evaluates the function of problem ``idx`` (integer index array) at ``x``.
    Chandrupatla's method: the next point is x = a + t (b - a) on the bracket (a, b) (a the newest point, c the
    one it replaced), t from inverse quadratic interpolation through (a, b, c) where the three points make it
    safe, with xi = (a - b)/(c - b) and phi = (f_a - f_b)/(f_c - f_b),

        phi^2 < xi  and  (1 - phi)^2 < 1 - xi:
            t = f_a f_c/((f_b - f_a)(f_b - f_c)) + (c - a)/(b - a) f_a f_b/((f_c - f_a)(f_c - f_b)),

    else t = 1/2 (bisection), t kept a tolerance away from the ends; on a third step where the last three
    did not halve the bracket, t = 1/2 (never much slower than bisection). Stops when the bracket is below
    rtol * |x| (the midpoint is returned) or f = 0 at a point."""
    a, b = np.array(lo, float), np.array(hi, float)
    fa, fb = np.array(flo, float), np.array(fhi, float)
    x = np.where(fa == 0, a, np.where(fb == 0, b, np.nan))
    active = np.isnan(x)
    c, fc = b.copy(), fb.copy()
    t = np.full(a.shape, 0.5)
    width = np.abs(b - a)               # bracket width three steps ago (the bisection guard)
    for it in range(maxiter):
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            break
        A, B, FA, FB = a[idx], b[idx], fa[idx], fb[idx]
        ti = t[idx]
        if it % 3 == 2:                 # the last three steps did not halve the bracket: bisect
            slow = np.abs(B - A) > 0.5 * width[idx]
            width[idx] = np.abs(B - A)
            ti = np.where(slow, 0.5, ti)
        xt = A + ti * (B - A)
        ft = np.asarray(f(xt, idx), float)
        same = np.sign(ft) == np.sign(FA)          # the root is in [xt, b]: a is replaced, else b is
        C, FC = np.where(same, A, B), np.where(same, FA, FB)
        B, FB = np.where(same, B, A), np.where(same, FB, FA)
        A, FA = xt, ft
        a[idx], b[idx], c[idx], fa[idx], fb[idx], fc[idx] = A, B, C, FA, FB, FC
        gap = np.abs(B - A)
        tol = 0.5 * rtol * np.maximum(np.abs(A), np.abs(B))
        done = (FA == 0) | (gap <= 2 * tol) | ~np.isfinite(gap)
        x[idx[done]] = np.where(FA[done] == 0, A[done], 0.5 * (A[done] + B[done]))
        active[idx[done]] = False
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            xi, phi = (A - B) / (C - B), (FA - FB) / (FC - FB)
            iqi = (phi * phi < xi) & ((1 - phi) ** 2 < 1 - xi)
            tn = FA / (FB - FA) * FC / (FB - FC) + (C - A) / (B - A) * FA / (FC - FA) * FB / (FC - FB)
            edge = tol / gap
        t[idx] = np.clip(np.where(iqi & np.isfinite(tn), tn, 0.5), edge, 1 - edge)
    rest = np.isnan(x)
    x[rest] = 0.5 * (a[rest] + b[rest])
    return x
