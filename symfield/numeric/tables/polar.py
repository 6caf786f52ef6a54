"""The polar Chebyshev-Fourier rule: C(theta) = E[f(u) g(v)] for all theta at once (docs/numerics.md section 3).

With u = sqrt(q1) r cos(a), v = sqrt(q2) r cos(a - theta) (the standard construction in polar coordinates)
and A_m(rho) the Chebyshev coefficients of f(rho x) on [-1, 1],
    C(theta) = sum_m P_m cos(m theta),   P_m = (2 - [m = 0]) int_0^inf r e^(-r^2/2) A_m(sqrt(q1) r) B_m(sqrt(q2) r) dr,
so one set of coefficients per q gives C at every theta, C/cos(theta) for odd psi and the
distance (V - C)/(2 sin^2(theta/2)) as sums of positive terms, without cancellation.
"""
from __future__ import annotations

import math

import numpy as np

from symfield.core.errors import NotCertified
from symfield.numeric import chebyshev as cheb

_GLT, _GLW = np.polynomial.legendre.leggauss(12)
R_MAX = 10.0


def _radial_rule(qmax):
    """Nodes/weights of int_0^R_MAX r e^(-r^2/2) h(r) dr: panels graded geometrically towards 0 from
    r0 = pi/(4 sqrt(qmax)) (h's singularities lie on the imaginary axis at |r| >= pi/(2 sqrt(q)) for
    tanh-like phi), unit panels above 1; 12 Gauss-Legendre points each."""
    r0 = min(1.0, math.pi / (4.0 * math.sqrt(qmax)))
    edges = [0.0]
    r = r0
    while r < 0.75:
        edges.append(r)
        r *= 2.0
    edges += [float(k) for k in range(1, int(R_MAX) + 1)]
    e = np.asarray(edges)
    a, b = e[:-1, None], e[1:, None]
    rr = (a + 0.5 * (b - a) * (1 + _GLT)).ravel()
    w = (0.5 * (b - a) * _GLW).ravel() * rr * np.exp(-0.5 * rr * rr)
    return rr, w


def _angular(f, rho, parity):
    """A[i, m] = (1/2 pi) int f(rho_i cos a) e^(-i m a) da, m = 0..K (DCT-I on K + 1 Chebyshev points,
    K doubled until the last quarter of the coefficients is below 1e-15 of the largest)."""
    K = 32
    while True:
        xs = cheb.second_kind(K, symmetric=True)     # exactly antisymmetric: x_(K-j) = -x_j
        F = f((rho[:, None] * xs[None, :]).ravel()).reshape(rho.size, K + 1)
        A = cheb.cos_coefficients(F, axis=1)
        top = np.abs(A).max(initial=0.0)
        if np.abs(A[:, 3 * K // 4:]).max(initial=0.0) <= 1e-15 * top or top == 0:
            break
        K *= 2
        if K > 2 ** 17:
            raise NotCertified(f"polar rule: the angular series of the activation at radius {rho.max():.3g} "
                             f"needs more than 2^17 terms")
    if parity == 1:
        A[:, 0::2] = 0.0
    elif parity == 2:
        A[:, 1::2] = 0.0
    return A


def polar_coefficients(f, g, q1, q2, parity=0):
    """Cosine coefficients P_m of C(theta) = E[f(u) g(v)] = sum_m P_m cos(m theta), where
    u = sqrt(q1) r cos(a), v = sqrt(q2) r cos(a - theta) (the standard construction in polar
    coordinates of (z1, z2)): with A_m(rho) the Chebyshev coefficients of f(rho x) on [-1, 1],
        P_m = (2 - [m = 0]) int_0^inf r e^(-r^2/2) A_m(sqrt(q1) r) B_m(sqrt(q2) r) dr.
    f, g: vectorised float64 callables; parity 1 (odd) / 2 (even) zeroes the vanishing modes."""
    r, w = _radial_rule(max(q1, q2, 1e-300))
    parts = []
    # radii in chunks (one panel of 12 each): small radii need few angular terms
    for i in range(0, r.size, _GLT.size):
        sl = slice(i, i + _GLT.size)
        A = _angular(f, math.sqrt(q1) * r[sl], parity)
        B = A if (g is f and q1 == q2) else _angular(g, math.sqrt(q2) * r[sl], parity)
        m = min(A.shape[1], B.shape[1])
        parts.append((w[sl, None] * A[:, :m] * B[:, :m]).sum(0))
    P = np.zeros(max(p.size for p in parts))
    for p in parts:
        P[:p.size] += p
    P[1:] *= 2.0
    return P


def polar_eval(P, theta):
    """sum_m P_m cos(m theta) at an array of theta."""
    theta = np.asarray(theta, dtype=float)
    m = np.arange(P.size)
    out = np.empty(theta.size)
    for i in range(0, theta.size, 256):
        out[i:i + 256] = np.cos(np.outer(theta.ravel()[i:i + 256], m)) @ P
    return out.reshape(theta.shape)


def polar_eval_over_cos(P, theta):
    """C(theta)/cos(theta) for odd C (odd modes only): with d = pi/2 - theta,
    cos(m theta)/cos(theta) = (-1)^((m-1)/2) sin(m d)/sin(d) -- no cancellation as theta -> pi/2."""
    theta = np.asarray(theta, dtype=float)
    m = np.arange(1, P.size, 2)
    coef = P[1::2] * np.where(((m - 1) // 2) % 2 == 0, 1.0, -1.0)
    d = (0.5 * math.pi - theta).ravel()
    out = np.empty(d.size)
    for i in range(0, d.size, 256):
        dd = d[i:i + 256]
        sd = np.sin(dd)
        S = np.where(sd[:, None] != 0, np.sin(np.outer(dd, m)) / np.where(sd == 0, 1.0, sd)[:, None], m[None, :])
        out[i:i + 256] = S @ coef
    return out.reshape(theta.shape)


def polar_distance(P, theta):
    """sum_(m>=1) P_m U_(m-1)(cos t)^2, t = theta/2, U_(m-1)(cos t) = sin(m t)/sin(t) (-> m at t = 0):
    (V - C(theta))/(2 sin^2(theta/2)) for C = sum_m P_m cos(m theta), since 1 - cos(m theta) = 2 sin^2(m t).
    For f = g, q1 = q2 every P_m >= 0: a sum of positive terms, no cancellation as theta -> 0."""
    t = 0.5 * np.asarray(theta, dtype=float).ravel()
    m = np.arange(1, P.size)
    out = np.empty(t.size)
    for i in range(0, t.size, 256):
        tt = t[i:i + 256]
        st = np.sin(tt)
        S = np.where(st[:, None] != 0, np.sin(np.outer(tt, m)) / np.where(st == 0, 1.0, st)[:, None], m[None, :])
        out[i:i + 256] = (S * S) @ P[1:]
    return out.reshape(np.shape(theta))


# ----------------------------------------------------------------------------- node evaluator
class Polar2:
    """Vectorised E[f(u) g(v)] at arrays (q1, q2, q12) via polar_coefficients (cached per (q1, q2))."""

    def __init__(self, f, g, parity, expr=None):
        self.f, self.g, self.parity, self.cache = f, g, parity, {}
        self.expr = expr     # f's SymPy expression (f = g), when known

    def coefficients(self, q1, q2):
        k = (float(q1), float(q2))
        if k not in self.cache:
            if len(self.cache) > 256:
                self.cache.clear()
            self.cache[k] = polar_coefficients(self.f, self.g, *k, parity=self.parity)
        return self.cache[k]

    def __call__(self, a, b, c):
        a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, c)))
        out = np.empty(a.shape)
        flat = [v.ravel() for v in (a, b, c)]
        res = out.reshape(-1)
        keys = np.stack(flat[:2], axis=1)
        for key in np.unique(keys, axis=0):
            sel = np.all(keys == key, axis=1)
            k = (float(key[0]), float(key[1]))
            P = self.coefficients(*k)
            sq = math.sqrt(k[0]) * math.sqrt(k[1])
            cc = np.clip(flat[2][sel] / sq, -1.0, 1.0)
            th = np.arctan2(np.sqrt(np.maximum((1 - cc) * (1 + cc), 0.0)), cc)
            res[sel] = polar_eval(P, th)
        return out
