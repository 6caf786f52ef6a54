"""The variance map of a linearly growing phi at large q, without cancellation (docs/numerics.md section 8).

If phi(x)/x -> b (x -> +inf) and a (x -> -inf), its q -> inf limit is phi_L(x) = a min(x, 0) + b max(x, 0)
(symfield.symbolic.limits), whose variance map is exactly q V_L(1). So, exactly,

    V(q) = q V_L(1) + R(q),   R(q) = E[phi(x)^2 - phi_L(x)^2],
    g(q) = sigma_w2 V(q) + sigma_b2 - q = (sigma_w2 V_L(1) - 1) q + sigma_w2 R(q) + sigma_b2,

and g is computed from R, whose value the rounding of sigma_w2 V(q) - q would swamp at large q. R is a
fixed Gauss-Legendre rule on [-X, X]: the integrand is evaluated once per kernel, each q costs one
weighted sum. Used for q >= Q_SPLIT.
"""
from __future__ import annotations

import math

import numpy as np
import sympy as sp

from symfield.core import caches
from symfield.numeric.evaluate import NUMPY_MODULES, vectorised
from symfield.numeric.maps import maps
from symfield.symbolic.limits import limit_kernel

X_WINDOW = 200.0     # d is integrated over [-X_WINDOW, X_WINDOW]
PANEL = 0.5          # Gauss-Legendre panel width (12 nodes per panel)
DECAY_RTOL = 1e-18   # d must be below this times int |d| on the outermost unit of the window
Q_SPLIT = 1e4        # g(q) uses the split form from this q upwards
N_SERIES = 12        # terms of the 1/q series of R (Remainder.q_series and up)
SERIES_RTOL = 1e-17  # ... used where its truncation bound is below this times sum |w d|
_T, _W = np.polynomial.legendre.leggauss(12)
_DONE: dict = caches.memo()


class Remainder:
    """R(q) = E[phi^2 - phi_L^2] on float64 arrays q >= Q_SPLIT, and V_L(1).

    From ``q_series`` up, exp(-x^2/2q) is expanded: R(q) = sum_k<N_SERIES M_2k (-1/2q)^k/k! / sqrt(2 pi q),
    M_2k = sum_i w_i d_i x_i^2k. The Taylor remainder of e^-t (t >= 0) is at most t^N/N!, so the series is
    within SERIES_RTOL sum_i |w_i d_i| of the node sum where A_2N/((2q)^N N!) is, A_2N = sum_i |w_i d_i| x_i^2N."""

    def __init__(self, nodes, weights, d, vl1):
        self.x2, self.wd, self.VL1 = nodes * nodes, weights * d, vl1
        k = np.arange(N_SERIES)
        self.moments = (self.wd[None, :] * self.x2[None, :] ** k[:, None]).sum(axis=1) / \
            np.array([math.factorial(int(j)) for j in k], float)
        a2n = float(np.sum(np.abs(self.wd) * self.x2 ** N_SERIES)) / math.factorial(N_SERIES)
        self.q_series = max(Q_SPLIT, 0.5 * (a2n / (SERIES_RTOL * float(np.sum(np.abs(self.wd))))) ** (1 / N_SERIES))

    def __call__(self, q):
        q = np.asarray(q, float)
        flat = q.reshape(-1)
        out = np.empty(flat.shape)
        far = flat >= self.q_series
        if far.any():
            u = -0.5 / flat[far]
            acc = np.zeros(u.shape)
            for m in self.moments[::-1]:          # Horner in u = -1/(2q)
                acc = acc * u + m
            out[far] = acc / np.sqrt(2 * math.pi * flat[far])
        near = ~far
        if near.any():
            qn = flat[near].reshape(-1, 1)
            out[near] = (np.exp(-self.x2[None, :] / (2 * qn)) / np.sqrt(2 * math.pi * qn)) @ self.wd
        return out.reshape(q.shape)


def _rule(kinks):
    cuts = np.union1d(np.arange(-X_WINDOW, X_WINDOW + PANEL / 2, PANEL),
                      [k for k in kinks if abs(k) < X_WINDOW])
    a, b = cuts[:-1], cuts[1:]
    half, mid = (b - a) / 2, (b + a) / 2
    return (mid[:, None] + half[:, None] * _T).ravel(), (half[:, None] * _W).ravel()


def remainder(K) -> Remainder | None:
    """The :class:`Remainder` of an unpooled kernel with a q -> inf limit kernel whose d decays within the
    window; None otherwise (pools, bounded or homogeneous phi, slowly decaying phi - phi_L)."""
    if K in _DONE:
        return _DONE[K]
    out = None
    LK = None if K.act.pool is not None else limit_kernel(K)
    if LK is not None:
        phi, phiL = K.act.expr, LK.act.expr
        nodes, weights = _rule(tuple(float(k) for k in K.kinks) + (0.0,))
        with np.errstate(all="ignore"):
            diff = vectorised(sp.piecewise_fold(phi - phiL), NUMPY_MODULES)(nodes)
            both = vectorised(phi + phiL, NUMPY_MODULES)(nodes)
        d = diff * both
        scale = float(np.sum(weights * np.abs(d)))
        edge = np.abs(nodes) >= X_WINDOW - 1
        if np.all(np.isfinite(d)) and scale > 0 and float(np.max(np.abs(d[edge]))) <= DECAY_RTOL * scale:
            out = Remainder(nodes, weights, d, float(maps(LK).V(1.0)))
    _DONE[K] = out
    return out


def g_split(rem: Remainder, sw, sb, q):
    """g(q) = (sw V_L(1) - 1) q + sw R(q) + sb (module docstring), float64 arrays."""
    return (sw * rem.VL1 - 1.0) * q + sw * rem(q) + sb
