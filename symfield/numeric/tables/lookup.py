"""A packed table's V, C and D at arrays of points, in NumPy: the engine's float64 lookups without compiled code.

The arithmetic of :mod:`symfield.numeric.kernels.table_maps` (the per-point maps the compiled recursion runs),
vectorised over points: the same panel coordinate x, theta = atan2(sqrt((1 - c)(1 + c)), c), the cell found by
the same bisection over its panel's edges, and the cell's Chebyshev sum written as

    sum_(i,j < NT) a_ij T_i(x) T_j(y)    (T_k by the three-term recurrence; |x|, |y| <= 1)

where table_maps runs Clenshaw's recurrence: the two agree to rounding (tests/numeric/test_table_lookup.py).
Points go in blocks of CHUNK (a block gathers CHUNK x NT^2 coefficients). NaN outside the table, as there.
"""
from __future__ import annotations

import numpy as np

from symfield.numeric.kernels.layout import (BLOCK, DEGREE, E0, HAS_R, KIND, NT, OFF_COEF, OFF_EDGES, OFF_FIRST,
                                             OFF_RCOEF, OFF_REDGES, OFF_RFIRST, OFF_V, P_HI, P_LO, PARITY, PSI0SQ,
                                             Q0, SCALED, SQ0, V1)

CHUNK = 4096


def _blocks(fn, M, *args):
    """fn(M, *block) over blocks of CHUNK points of the flat float arrays ``args``."""
    args = [np.ascontiguousarray(a, dtype=float).ravel() for a in args]
    out = np.empty(args[0].size)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for s in range(0, out.size, CHUNK):
            out[s:s + CHUNK] = fn(M, *(a[s:s + CHUNK] for a in args))
    return out


def V(M, q):
    """V at an array of q (homogeneous: V(1) q^n; general: q v(x) if psi(0) = 0 else v(x))."""
    return _blocks(_V, M, q)


def C(M, q1, q2, q12):
    """C at arrays (general kind: equal norms q2 = q1 only)."""
    return _blocks(_C, M, q1, q2, q12)


def D(M, q1, q2, q12, d):
    """D = E[(psi(u) - psi(v))^2] at arrays, d = q1 + q2 - 2 q12, accurate as c -> 1 (table_maps.D)."""
    return _blocks(_D, M, q1, q2, q12, d)


def _rows(y):
    """T_0(y) .. T_(NT-1)(y), one row per point."""
    T = np.empty((y.size, NT))
    T[:, 0] = 1.0
    T[:, 1] = y
    for k in range(2, NT):
        T[:, k] = 2.0 * y * T[:, k - 1] - T[:, k - 2]
    return T


def _cells(M, off, width, j):
    """Rows j of the coefficient blocks of ``width`` numbers that start at M[off] (one copy per point)."""
    if j.size == 0:
        return np.empty((0, width))
    return np.take(M[off:off + width * (int(j.max()) + 1)].reshape(-1, width), j, axis=0)


def _sum1(M, off, width, j, y):
    """sum_k a_k T_k(y), a = the first NT numbers of block j (``width`` numbers each) from M[off]."""
    return np.einsum("nk,nk->n", _cells(M, off, width, j)[:, :NT], _rows(y))


def _sum2(M, off, width, j, x, y):
    """sum_(i,j) a_ij T_i(x) T_j(y), a = block j read as NT x NT (row i: T_i(x))."""
    a = _cells(M, off, width, j)[:, :NT * NT].reshape(-1, NT, NT)
    return np.einsum("ni,ni->n", np.matmul(a, _rows(y)[:, :, None])[:, :, 0], _rows(x))


def _panel(M, q):
    """(i, x): each q's panel among those stored (-1 if none) and its coordinate in [-1, 1]."""
    low = q < M[Q0]
    mant, e = np.frexp(q)
    p = np.where(low, 0, e - int(M[E0]))
    x = np.where(low, 2.0 * np.sqrt(q) / M[SQ0] - 1.0, 2.0 * np.log2(mant) + 1.0)
    bad = (p < M[P_LO]) | (p > M[P_HI]) | ~((q >= 0.0) & (q < np.inf))
    return np.where(bad, -1, p - int(M[P_LO])), x


def _locate(M, first, edges, i, th):
    """(j, y): for each point the last cell j of panel i whose lower edge is <= theta (the bisection of
    table_maps._locate, all points at once) and theta's coordinate y in [-1, 1] in it."""
    lo = M[first + i].astype(np.int64)
    hi = M[first + i + 1].astype(np.int64) - 1
    while True:
        open_ = lo < hi
        if not open_.any():
            break
        mid = (lo + hi + 1) // 2
        up = M[edges + 2 * mid] <= th
        lo = np.where(open_ & up, mid, lo)
        hi = np.where(open_ & ~up, mid - 1, hi)
    ta, tb = M[edges + 2 * lo], M[edges + 2 * lo + 1]
    return lo, np.clip((2.0 * th - ta - tb) / (tb - ta), -1.0, 1.0)


def _V(M, q):
    if M[KIND] == 1.0:
        return M[V1] * q ** int(M[DEGREE])
    out = np.full(q.size, np.nan)
    i, x = _panel(M, q)
    k = np.flatnonzero(i >= 0)
    v = _sum1(M, int(M[OFF_V]), NT, i[k], x[k])
    out[k] = q[k] * v if M[SCALED] == 1.0 else v
    return out


def _C(M, q1, q2, q12):
    hom, par = M[KIND] == 1.0, int(M[PARITY])
    eq = q1 == q2
    sq = np.where(eq, q1, np.sqrt(q1) * np.sqrt(q2))
    c = q12 / np.where(eq, q1, sq)
    a = np.where(eq, (q1 - q12) / q1, 1.0 - c)
    b = np.where(eq, (q1 + q12) / q1, 1.0 + c)
    th = np.arctan2(np.sqrt(np.maximum(a * b, 0.0)), np.abs(c) if par != 0 else c)
    out = np.full(q1.size, np.nan)
    zero = sq == 0.0
    out[zero & (eq | hom)] = 0.0 if hom else M[PSI0SQ]
    live = ~zero & (eq | hom)
    i, x = (np.zeros(q1.size, np.int64), np.zeros(q1.size)) if hom else _panel(M, q1)
    k = np.flatnonzero(live & (i >= 0))
    lo, y = _locate(M, int(M[OFF_FIRST]), int(M[OFF_EDGES]), i[k], th[k])
    cell = (int(M[OFF_COEF]), int(M[BLOCK]), lo)
    if hom:
        g, n = _sum1(M, *cell, y), int(M[DEGREE])
        out[k] = q12[k] * sq[k] ** (n - 1) * g if par == 1 else sq[k] ** n * g
        return out
    g = _sum2(M, *cell, x[k], y)
    out[k] = g if M[SCALED] == 0.0 else q12[k] * g if par == 1 else q1[k] * g
    return out


def _D(M, q1, q2, q12, d):
    hom, par = M[KIND] == 1.0, int(M[PARITY])
    out = np.full(q1.size, np.nan)
    valid = np.ones(q1.size, bool) if hom else (q1 == q2) & (_panel(M, q1)[0] >= 0)
    if M[HAS_R] == 0.0:
        k = np.flatnonzero(valid)
        out[k] = _V(M, q1[k]) + _V(M, q2[k]) - 2.0 * _C(M, q1[k], q2[k], q12[k])
        return out
    eq = q1 == q2
    s2eq = np.where(q1 > 0.0, d / (4.0 * q1), 0.0)
    if hom:
        n = int(M[DEGREE])
        r1, r2 = np.sqrt(q1), np.sqrt(q2)
        sq = np.where(eq, q1, r1 * r2)
        dr = np.where(eq, 0.0, (q1 - q2) / (r1 + r2))     # sqrt(q1) - sqrt(q2) without cancellation
        sn = sum(r1 ** j * r2 ** (n - 1 - j) for j in range(n))
        a0 = np.where(eq, 0.0, M[V1] * (dr * sn) ** 2)
        s2 = np.where(eq, s2eq, np.where(sq > 0.0, (d - dr * dr) / (4.0 * sq), 0.0))
        scale = 2.0 * sq ** n
        i, x = np.zeros(q1.size, np.int64), np.zeros(q1.size)
    else:
        i, x = _panel(M, q1)
        sq, s2, scale, a0 = q1, s2eq, 2.0 * q1, np.zeros(q1.size)
    zero = valid & (sq == 0.0)
    out[zero] = a0[zero]
    s2 = np.clip(s2, 0.0, 1.0)
    far = s2 > 0.5
    co2 = np.where(far, np.clip((sq + q12) / (2.0 * sq), 0.0, 1.0), 1.0 - s2)
    live = valid & ~zero
    if par == 1:                     # theta > pi/2, odd psi: V + V - 2C (C <= 0 there)
        k = np.flatnonzero(live & far)
        out[k] = _V(M, q1[k]) + _V(M, q2[k]) - 2.0 * _C(M, q1[k], q2[k], q12[k])
        live &= ~far
    elif par == 2:                   # even psi: R at pi - theta
        s2, co2 = np.where(far, co2, s2), np.where(far, s2, co2)
    k = np.flatnonzero(live)
    th = 2.0 * np.arctan2(np.sqrt(s2[k]), np.sqrt(co2[k]))
    lo, y = _locate(M, int(M[OFF_RFIRST]), int(M[OFF_REDGES]), i[k], th)
    cell = (int(M[OFF_RCOEF]), int(M[BLOCK]), lo)
    r = _sum1(M, *cell, y) if hom else _sum2(M, *cell, x[k], y)
    out[k] = a0[k] + scale[k] * s2[k] * r
    return out
