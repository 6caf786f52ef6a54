"""A quadrature rule of the max-pool pair law for ONE correlation c, reusable for every (q1, q2).

(S, T) = (max_j u_j/sqrt(q1), max_j v_j/sqrt(q2)) has CDF F(s, t; c)^k and density (docs/theory.md section 4)

    h_k = k F^(k-1) rho_c + k(k-1) F^(k-2) F_s F_t,   F_s F_t = n(s) n(t) N((t - c s)/r) N((s - c t)/r),

r = sqrt(1 - c^2). The law depends on c only, so one rule {(s_i, t_i, w_i)} gives

    C(q1, q2, c) = E[f(sqrt(q1) S) g(sqrt(q2) T)] ~ sum_i w_i f(sqrt(q1) s_i) g(sqrt(q2) t_i)

for all q1, q2 <= qmax at the cost of evaluating f and g. Coordinates, panels and grading:
docs/numerics.md section 5; measured error: tests/numeric/test_pool_monotone.py.
"""
from __future__ import annotations

import math

import numpy as np

from symfield.numeric.quadrature import bvn_cdf

L = 9.0
_T, _W = np.polynomial.legendre.leggauss(10)
_SQ2PI = math.sqrt(2 * math.pi)


def _npdf(x):
    return np.exp(-0.5 * x * x) / _SQ2PI


def _offsets(eps):
    """Grading offsets eps 2^j < 1 (empty when eps >= 1)."""
    out = []
    while eps < 1.0 and len(out) < 60:
        out.append(eps)
        eps *= 2.0
    return np.asarray(out)


def _panels(b, sub=1, n=10):
    """Gauss-Legendre nodes and weights (n points) on the panels of sorted breakpoints b (..., m),
    each panel split into `sub` equal parts (sub > 1 and n != 10: convergence checks)."""
    T, W = (_T, _W) if n == 10 else np.polynomial.legendre.leggauss(n)
    if sub > 1:
        f = np.arange(sub) / sub
        b = np.concatenate([(b[..., :-1, None] + np.diff(b, axis=-1)[..., None] * f).reshape(*b.shape[:-1], -1),
                            b[..., -1:]], axis=-1)
    hw = 0.5 * np.diff(b, axis=-1)[..., None]
    x = b[..., :-1, None] + hw * (1 + T)
    w = np.broadcast_to(hw * W, x.shape)
    return x.reshape(*b.shape[:-1], -1), w.reshape(*b.shape[:-1], -1)


def _rows(centre, d, base, lo, hi):
    """Per-row breakpoints: base columns, centre and centre +- d, clipped to [lo, hi] (rows), sorted."""
    cols = [np.broadcast_to(base, (centre.size, base.size)), centre[:, None],
            centre[:, None] + d[None, :], centre[:, None] - d[None, :], lo[:, None], hi[:, None]]
    return np.sort(np.clip(np.concatenate(cols, axis=1), lo[:, None], hi[:, None]), axis=1)


def _outer(eps, sub=1, n=10):
    d = _offsets(eps)
    b = np.unique(np.concatenate([np.arange(-L, L + 1), [0.0], d, -d]))
    return _panels(b, sub, n)


class Rule:
    """Nodes (s, t) and weights w (flat arrays) of h_k for correlation c, resolving q <= qmax; also
    dt = t - s without cancellation (term 1: r z - (1 - c) s, term 2 at c > 0: r w), given ``omc`` = 1 - c
    accurately (e.g. 2 sin^2(theta/2)); for E[(f(S) - f(T))^2] as c -> 1."""

    def __init__(self, c, k, qmax, sub=1, n=10, omc=None):
        from scipy.special import ndtr
        c, qmax = float(c), max(float(qmax), 1e-300)
        omc = 1.0 - c if omc is None else float(omc)
        self.c, self.k, self.qmax = c, k, qmax
        et = 0.25 / math.sqrt(qmax)                 # t-scale of phi(sqrt(q) t) near t = 0
        r = math.sqrt(max(omc * (1 + c), 0.0))
        if r < 1e-150:
            self.s, self.t, self.w = self._degenerate(c, k, min(et, 0.25), sub, n)
            self.dt = np.zeros_like(self.s) if c > 0 else self.t - self.s
            return
        s, ws = _outer(min(r, 1.0 / math.sqrt(qmax)) / 4, sub, n)
        ws = ws * _npdf(s)
        ones = np.ones_like(s)
        # term 1: t = c s + r z, z in [-L, L]
        zb = _rows(-c * s / r, _offsets(et / r), np.arange(-L, L + 1), -L * ones, L * ones)
        z, wz = _panels(zb, sub, n)
        t1 = c * s[:, None] + r * z
        d1 = r * z - omc * s[:, None]
        w1 = ws[:, None] * wz * _npdf(z) * k
        s1 = np.broadcast_to(s[:, None], t1.shape)
        keep = w1 > 1e-19                  # F <= 1: dropped mass < 1e-16
        s1, t1, w1, d1 = s1[keep], t1[keep], w1[keep], d1[keep]
        if k > 1:
            w1 = w1 * bvn_cdf(s1, t1, c) ** (k - 1)
        parts = [(s1, t1, w1, d1)]
        if k > 1:   # term 2: t = sigma s + r w
            sg, a = (1.0 if c > 0 else -1.0), (1 - abs(c)) / r
            lo = np.maximum(-sg * a * s - L, (-L - sg * s) / r)
            hi = (L - sg * s) / r
            if c > 0:
                hi = np.minimum(hi, (a * s + L) / c)
            elif c < 0:
                lo = np.maximum(lo, (a * s + L) / c)
            ext, step, e = [], 1.0, 0.0
            top = max(np.abs(lo).max(), np.abs(hi).max()) - L
            while e < top and len(ext) < 4000:
                e += step
                ext.append(e)
                step = min(2 * step, max(1.0, 1.0 / r))
            ext = L + np.asarray(ext)
            base = np.concatenate([np.arange(-L, L + 1), ext, -ext])
            ok = hi > lo
            wb = _rows(-sg * s[ok] / r, _offsets(et) / r, base, lo[ok], hi[ok])   # graded up to unit in t
            w_, ww = _panels(wb, sub, n)
            so = s[ok][:, None]
            t2 = sg * so + r * w_
            w2 = (ws[ok][:, None] * ww * r * _npdf(t2) * ndtr(sg * a * so + w_) * ndtr(a * so - c * w_)
                  * k * (k - 1))
            if k > 2:
                w2 = w2 * bvn_cdf(np.broadcast_to(so, t2.shape), t2, c) ** (k - 2)
            parts.append((np.broadcast_to(so, t2.shape), t2, w2, r * w_ if c > 0 else t2 - so))
        self.s, self.t, self.w, self.dt = (np.concatenate([p[i].ravel() for p in parts]) for i in range(4))
        keep = self.w != 0
        self.s, self.t, self.w, self.dt = self.s[keep], self.t[keep], self.w[keep], self.dt[keep]

    @staticmethod
    def _degenerate(c, k, eps, sub, n):
        """c = 1: S = T = M_k (density k n N^(k-1)); c = -1: (S, T) = (B, -A), (A, B) = (min, max),
        density k(k-1) n(a) n(b) (N(b) - N(a))^(k-2) on a < b."""
        from scipy.special import ndtr
        b, wb = _outer(eps, sub, n)
        if c > 0:
            return b, b.copy(), wb * _npdf(b) * k * ndtr(b) ** (k - 1)
        if k == 1:
            return b, -b, wb * _npdf(b)
        d = _offsets(eps)
        ab = _rows(0.0 * b, d, np.arange(-L, L + 1), -L * np.ones_like(b), b)
        a, wa = _panels(ab, sub, n)
        bb = np.broadcast_to(b[:, None], a.shape)
        w = (wb * _npdf(b))[:, None] * wa * _npdf(a) * k * (k - 1) * np.maximum(ndtr(bb) - ndtr(a), 0.0) ** (k - 2)
        return bb.ravel(), -a.ravel(), w.ravel()

    def expect(self, f, g, q1, q2):
        """sum_i w_i f(sqrt(q1) s_i) g(sqrt(q2) t_i) at arrays q1, q2 (same shape; f, g vectorised)."""
        q1, q2 = np.broadcast_arrays(np.asarray(q1, float), np.asarray(q2, float))
        out = np.empty(q1.shape)
        res = out.reshape(-1)
        for i, (a, b) in enumerate(zip(q1.ravel(), q2.ravel())):
            res[i] = np.dot(self.w, f(math.sqrt(a) * self.s) * g(math.sqrt(b) * self.t))
        return out
