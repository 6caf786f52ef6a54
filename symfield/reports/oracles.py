"""Independent oracles for Gaussian expectations, written from phi alone (never through the kernel maps).

Used by ``sf.verify`` and by the test suite (tests/oracles.py adds the literature closed forms):

    mp_expect1(f, q)            E[f(u)], u ~ N(0, q): mpmath.quad of the defining integral on panels
    mp_expect2(f, g, q1, q2, q12)
                                E[f(u) g(v)], (u, v) ~ N(0, [[q1, q12], [q12, q2]]) in the conditional
                                form v | u ~ N(q12 u/q1, (q1 q2 - q12^2)/q1), by nested composite Gauss-Legendre
    mc_expect(f, g, z, q1, ...) Monte Carlo mean and standard error of f(u) g(v) from given normals z

(docs/theory.md section 3 defines the expectations.)
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
from symfield.core import caches


# ---------------------------------------------------------------- 1-D: adaptive mpmath.quad
def _panels(mean, s, kinks, L):
    """Split points for a Gaussian N(mean, s^2) integral: +-L sd, every sd, every unit in x, kinks."""
    a, b = mean - L * s, mean + L * s
    pts = {a, b}
    pts.update(mean + j * s for j in range(-int(L), int(L) + 1))
    if s > 1:
        lo, hi = math.ceil(float(a)), math.floor(float(b))
        if hi - lo <= 400:
            pts.update(mpmath.mpf(t) for t in range(lo, hi + 1))
    pts.update(mpmath.mpf(k) for k in kinks if a < k < b)
    return sorted(pts)


def mp_expect1(f, q, kinks=(), dps=20, method="gauss-legendre"):
    """E[f(x)], x ~ N(0, q) = int f(x) exp(-x^2/(2q)) dx / sqrt(2 pi q), by ``mpmath.quad(method=...)``
    on panels of one sd over +-L sd, split at the kinks. L starts where the Gaussian tail is below
    10^-(dps+5) and grows (to 64 sd) while the integrand at +-L is not negligible against the value:
    a fast-growing f (x^128) puts its mass far out in the tail."""
    with mpmath.workdps(dps):
        q = mpmath.mpf(q)
        s = mpmath.sqrt(q)
        L = math.sqrt(2 * (dps + 5) * math.log(10))

        def weight(t):
            return f(t) * mpmath.exp(-t * t / (2 * q))
        while True:
            val = mpmath.quad(weight, _panels(mpmath.mpf(0), s, kinks, L), method=method)
            edge = max(abs(weight(L * s)), abs(weight(-L * s))) * s * L
            if L >= 64 or edge <= mpmath.mpf(10) ** -(dps + 5) * abs(val):
                return val / mpmath.sqrt(2 * mpmath.pi * q)
            L = min(2 * L, 64)


# ---------------------------------------------------------------- 2-D: nested composite Gauss-Legendre
def _gl(degree, dps):
    """mpmath's Gauss-Legendre nodes (3 * 2^(degree-1) of them) on [-1, 1]."""
    with mpmath.workdps(dps):
        return mpmath.calculus.quadrature.GaussLegendre(mpmath.mp).calc_nodes(degree, mpmath.mp.prec)


_PANELS: dict = caches.memo()


def _std_panel(a, nodes):
    key = (a, len(nodes), mpmath.mp.prec)
    if key not in _PANELS:
        _PANELS[key] = [(t0 + a + 1, w0 * mpmath.exp(-(t0 + a + 1) ** 2 / 2)) for t0, w0 in nodes]
    return _PANELS[key]


def _composite(fun, mean, s, kinks, nodes):
    """E[fun(w)], w ~ N(mean, s^2), by composite Gauss-Legendre in standard units t = (w - mean)/s on
    panels of two sd, split at the kinks (weights exp(-t^2/2) cached for unsplit panels): over
    [-8, 8], then outward two sd at a time (to 40 sd) while an outer panel still adds more than
    10^-(dps+3) of the total."""
    total = _panel_sum(fun, mean, s, kinks, nodes, range(-8, 8, 2))
    tol = mpmath.mpf(10) ** -(mpmath.mp.dps + 3)
    for a in range(8, 40, 2):
        tail = _panel_sum(fun, mean, s, kinks, nodes, (-a - 2, a))
        total += tail
        if abs(tail) <= tol * abs(total):
            break
    return total / mpmath.sqrt(2 * mpmath.pi)


def _panel_sum(fun, mean, s, kinks, nodes, starts):
    """Sum over the two-sd panels [a, a + 2] (a in ``starts``) of the Gauss-Legendre rule for
    exp(-t^2/2) fun(mean + s t), split at the kinks."""
    cuts = sorted((k - mean) / s for k in kinks)
    total = mpmath.mpf(0)
    for a in starts:
        inside = [t for t in cuts if a < t < a + 2]
        if not inside:
            for t, w in _std_panel(a, nodes):
                total += w * fun(mean + s * t)
            continue
        br = [mpmath.mpf(a)] + [mpmath.mpf(t) for t in inside] + [mpmath.mpf(a + 2)]
        for lo, hi in zip(br[:-1], br[1:]):
            h, m = (hi - lo) / 2, (hi + lo) / 2
            for t0, w0 in nodes:
                t = h * t0 + m
                total += h * w0 * mpmath.exp(-t * t / 2) * fun(mean + s * t)
    return total


def mp_expect2(f, g, q1, q2, q12, kinks=(), dps=15, degree=3):
    """E[f(u) g(v)] in mpmath by a nested composite Gauss-Legendre rule (12 nodes per two-sd panel,
    +-8 sd or further out while the tail adds, panels split at the kinks): u ~ N(0, q1) outside, v | u ~ N(q12 u/q1, (q1 q2 - q12^2)/q1)
    inside. A degenerate pair (q12^2 = q1 q2: v = q12 u/q1) is the 1-D E[f(u) g(q12 u/q1)]."""
    with mpmath.workdps(dps):
        q1, q2, q12 = mpmath.mpf(q1), mpmath.mpf(q2), mpmath.mpf(q12)
        var = (q1 * q2 - q12 * q12) / q1
        if var <= 0:
            return mp_expect1(lambda uu: f(uu) * g(q12 / q1 * uu), q1, kinks, dps)
        s1, sc = mpmath.sqrt(q1), mpmath.sqrt(var)
        nodes = _gl(degree, dps)

        def inner(uu):
            return _composite(g, q12 / q1 * uu, sc, kinks, nodes)
        return _composite(lambda uu: f(uu) * inner(uu), mpmath.mpf(0), s1, kinks, nodes)


# ---------------------------------------------------------------- Monte Carlo
def mc_expect(f, g, z, q1, q2=None, q12=None):
    """Monte Carlo (mean, standard error) of f(u) g(v) from standard normals z = (z1, z2) (arrays):
    u = sqrt(q1) z1, v = sqrt(q2) (c z1 + sqrt(1 - c^2) z2) with c = q12/sqrt(q1 q2).
    Without q2 the pair is (u, u), i.e. f(u) g(u); g None means g = 1. f, g: vectorised (NumPy)."""
    z1, z2 = z
    u = math.sqrt(q1) * z1
    if q2 is None:
        w = f(u) * (g(u) if g is not None else 1.0)
    else:
        c = q12 / math.sqrt(q1 * q2)
        v = math.sqrt(q2) * (c * z1 + math.sqrt(max(1 - c * c, 0.0)) * z2)
        w = f(u) * g(v)
    w = np.asarray(w, dtype=float)
    return float(w.mean()), float(w.std() / math.sqrt(w.size))
