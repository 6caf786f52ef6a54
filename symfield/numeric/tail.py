"""The analytic large-q tail of V, C and D at equal norms (docs/numerics.md section 11).

psi = h + l, h(x) = a min(x, 0) + b max(x, 0) + A H(-x) + B H(x) (degrees 1 and 0), l localized
(|l(x)| (1 + |x|)^2 <= 1e-40 for |x| >= X; l is taken as 0 there). With s = sqrt(q) sin theta, c = cos theta:

    V = E[h^2] + 2 E[h l] + E[l^2]
    C = E[h(u) h(v)] + 2 E[h(u) l(v)] + E[l(u) l(v)]
    D = E[(h(u) - h(v))^2] + 4 (E[h l] - E[h(u) l(v)]) + 2 (E[l^2] - E[l(u) l(v)])

the h-h parts in closed form (orthant moments; D's without cancellation as theta -> 0), and

    E[g]           = (2 pi q)^(-1/2) sum_k (-1/(2q))^k / k!  int x^(2k) g          (g = h l, l^2)
    E[h(u) l(v)]   = (2 pi q)^(-1/2) sum_p mu_p s^-p sum_(n+2k=p) c^n sin^(2k) (-1/2)^k / (n! k!) (s G1_n + G0_n)
    E[l(u) l(v)]   = (2 pi q sin theta)^(-1) sum_p s^(-2p) sum_m c^m / m! Q_pm

with mu_j = int x^j l, G_n = E[h(Z) He_n(Z)] split by degree, Q_pm = (-1/2)^(p-m) sum_(i+k=p-m) mu_(2i+m) mu_(2k+m)/(i! k!).
Each series is summed group by group until two consecutive groups, bounded with |l|'s moments, are below
TOL of the map's scale (V; V for C; D); a point where that fails (the corner s = O(1)) is refused (NaN, ok False).
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import sympy as sp

from symfield.core import caches
from symfield.symbolic.formula import X as x

TOL = 1e-13          # every series' two last groups below TOL x scale: the map is certified to ~1e-12
J = 80               # moments of l up to x^J
CUT = 1e-40          # |l(x)| (1 + |x|)^2 beyond X
NODES = np.polynomial.legendre.leggauss(20)
_TAILS: dict = caches.memo()


def tail(K) -> "Tail | None":
    """The tail of single-node kernel K, or None (pooled, homogeneous, or psi - h not localized)."""
    if K not in _TAILS:
        _TAILS[K] = None
        if (K.act.pool is None or K.act.k == 1) and K.homogeneity is None:
            try:
                _TAILS[K] = Tail.build(sp.lambdify(x, K.act.expr, "mpmath"), K.kinks)
            except Exception:       # phi not evaluable in mpmath on the real line: no tail, quadrature as before
                pass
    return _TAILS[K]


def _split(phi):
    """(a, b, A, B, X) of psi = h + l (module docstring), or None when psi - h is not localized."""
    with mpmath.workdps(60):
        R = mpmath.mpf(10) ** 4
        b = (phi(2 * R) - phi(R)) / R
        a = (phi(-2 * R) - phi(-R)) / (-R)
        a, b = float(a), float(b)
        A, B = float(phi(-R) + a * R), float(phi(R) - b * R)

        def ok(X):
            for t in np.geomspace(X, 1e4, 80):
                for y in (mpmath.mpf(t), -mpmath.mpf(t)):
                    h = (a * y + A) if y < 0 else (b * y + B)
                    if abs(phi(y) - h) * (1 + abs(y)) ** 2 > CUT:
                        return False
            return True
        for X in range(4, 201, 4):
            if ok(X):
                return a, b, A, B, X
    return None


class Tail:
    """Series constants of one activation; :meth:`V`, :meth:`C`, :meth:`D` return (value, certified)."""

    @classmethod
    def build(cls, phi, kinks=()):
        parts = _split(phi)
        if parts is None:
            return None
        self = cls()
        self.a, self.b, self.A, self.B, self.X = a, b, A, B, X = parts
        cuts = sorted({float(k) for k in kinks if -X < float(k) < X} | set(range(-X, X + 1)))
        t, w = NODES
        lo, hi = np.array(cuts[:-1]), np.array(cuts[1:])
        xs = (0.5 * (hi - lo)[:, None] * (t + 1) + lo[:, None]).ravel()
        ws = (0.5 * (hi - lo)[:, None] * w).ravel()
        with mpmath.workdps(40):
            lv = np.array([float(phi(mpmath.mpf(v)) - ((a * v + A) if v < 0 else (b * v + B))) for v in xs])
        hv = np.where(xs < 0, a * xs + A, b * xs + B)
        pw = xs[None, :] ** np.arange(J + 1)[:, None]            # x^j at the nodes
        self.mu, self.nu = pw @ (ws * lv), np.abs(pw) @ (ws * np.abs(lv))
        even = pw[::2]
        self.Mhl, self.Mhl_abs = even @ (ws * hv * lv), np.abs(even) @ (ws * np.abs(hv * lv))
        self.Mll = even @ (ws * lv * lv)
        # G_n = E[h(Z) He_n(Z)] by degree: E[H(Z) He_n] = P0_n, E[Z H(Z) He_n] = P0_(n+1) + n P0_(n-1)
        He0 = np.zeros(J + 2)                                      # He_n(0)
        He0[0] = 1.0
        for n in range(2, J + 2):
            He0[n] = -(n - 1) * He0[n - 2]
        P0 = np.concatenate([[0.5], He0[:J + 1] / math.sqrt(2 * math.pi)])
        P1 = np.array([P0[n + 1] + (n * P0[n - 1] if n else 0.0) for n in range(J + 1)])
        sg = (-1.0) ** np.arange(J + 1)
        self.G1, self.G0 = (b - sg * a) * P1, (B + sg * A) * P0[:J + 1]
        fact = np.array([math.factorial(n) for n in range(J + 1)], float)
        self.fact = fact
        P = J // 2
        self.Q, self.Qabs = np.zeros((P + 1, P + 1)), np.zeros((P + 1, P + 1))
        for p in range(P + 1):
            for m in range(p + 1):
                r = p - m
                i = np.arange(r + 1)
                f = 1 / (fact[i] * fact[r - i])
                self.Q[p, m] = (-0.5) ** r * np.sum(f * self.mu[2 * i + m] * self.mu[2 * (r - i) + m])
                self.Qabs[p, m] = 0.5 ** r * np.sum(f * self.nu[2 * i + m] * self.nu[2 * (r - i) + m])
        return self

    # ------------------------------------------------------------------ the series
    @staticmethod
    def _sum(group, n_groups, eps, *arrays):
        """sum_p group(p, *arrays[idx]) -> (value, bound) per point until two consecutive bounds total <= eps.
        Returns (sum, ok)."""
        n = eps.shape[0]
        total, ok = np.zeros(n), np.zeros(n, bool)
        idx, prev = np.arange(n), np.full(n, np.inf)
        for p in range(n_groups):
            v, bnd = group(p, *(a[idx] for a in arrays))
            total[idx] += v
            done = prev + bnd <= eps[idx]
            ok[idx[done]] = True
            prev = bnd[~done]
            idx = idx[~done]
            if not idx.size:
                break
        return total, ok

    def _one(self, M, Mabs, q, eps):
        """E[g], g localized with even moments M (absolute: Mabs)."""
        def group(k, q):
            f = (0.5 / q) ** k / self.fact[k] / np.sqrt(2 * np.pi * q)
            return (-1) ** k * M[k] * f, Mabs[k] * f
        return self._sum(group, J // 2 + 1, eps, q)

    def _hl(self, q, c, sn, eps):
        """E[h(u) l(v)] at correlation c = cos theta, sn = sin theta."""
        s = np.sqrt(q) * sn

        def group(p, q, c, sn, s):
            v, bnd = 0.0, 0.0
            for k in range(p // 2 + 1):
                n = p - 2 * k
                g = sn ** (2 * k) * 0.5 ** k / (self.fact[n] * self.fact[k])
                v = v + c ** n * g * (-1) ** k * (s * self.G1[n] + self.G0[n])
                bnd = bnd + np.abs(c) ** n * g * (s * abs(self.G1[n]) + abs(self.G0[n]))
            f = s ** -float(p) / np.sqrt(2 * np.pi * q)
            return self.mu[p] * v * f, self.nu[p] * bnd * f
        return self._sum(group, J + 1, eps, q, c, sn, s)

    def _ll(self, q, c, sn, eps):
        """E[l(u) l(v)]."""
        z = 1 / (q * sn * sn)

        def group(p, q, c, sn, z):
            v, bnd = 0.0, 0.0
            for m in range(p + 1):
                v = v + c ** m / self.fact[m] * self.Q[p, m]
                bnd = bnd + np.abs(c) ** m / self.fact[m] * self.Qabs[p, m]
            f = z ** p / (2 * np.pi * q * sn)
            return v * f, bnd * f
        return self._sum(group, J // 2 + 1, eps, q, c, sn, z)

    # ------------------------------------------------------------------ closed forms of h
    def _alpha_beta(self):
        return ((self.b, self.B, 1), (-self.a, self.A, -1))       # h = sum_s (alpha_s |x| + beta_s) H(s x)

    def _Vh(self, q):
        r = np.sqrt(q / (2 * np.pi))
        return sum(al * al * q / 2 + 2 * al * be * r + be * be / 2 for al, be, _ in self._alpha_beta())

    def _Ch(self, q, c, sn, th):
        """E[h(u) h(v)]: orthant moments E[u v; +,+] = q (sin f + (pi - f) cos f)/(2 pi), E[u; +,+] =
        sqrt(q/(2 pi)) (1 + cos f)/2, P(+,+) = (pi - f)/(2 pi), f = theta (same half-lines) or pi - theta."""
        r, out = np.sqrt(q / (2 * np.pi)), 0.0
        for al, be, s in self._alpha_beta():
            for al2, be2, t in self._alpha_beta():
                cf, f = (c, th) if s == t else (-c, np.pi - th)
                k11 = q * (sn + (np.pi - f) * cf) / (2 * np.pi)
                out = out + al * al2 * k11 + (al * be2 + be * al2) * r * (1 + cf) / 2 + be * be2 * (np.pi - f) / (2 * np.pi)
        return out

    def _Dh(self, q, th, omc):
        """E[(h(u) - h(v))^2] as a sum of terms without cancellation as theta -> 0 (omc = 1 - cos theta):
        2 a b q (1 - c) + (b - a)^2 D_relu + 2 (B - A)(a + b) sqrt(q/(2 pi)) (1 - c) + (B - A)^2 theta/pi,
        D_relu = q ((pi - theta)(1 - c) + theta - sin theta)/pi."""
        a, b, A, B = self.a, self.b, self.A, self.B
        t2 = th * th
        tms = np.where(th < 0.1, th * t2 / 6 * (1 - t2 / 20 * (1 - t2 / 42 * (1 - t2 / 72 * (1 - t2 / 110)))), th - np.sin(th))
        drelu = q * ((np.pi - th) * omc + tms) / np.pi
        return (2 * a * b * q * omc + (b - a) ** 2 * drelu + 2 * (B - A) * (a + b) * np.sqrt(q / (2 * np.pi)) * omc
                + (B - A) ** 2 * th / np.pi)

    # ------------------------------------------------------------------ the maps
    def V(self, q):
        """(V(q), ok) at an array q."""
        q = np.asarray(q, float)
        Vh = self._Vh(q)
        eps = TOL * np.maximum(np.abs(Vh), 1e-300) / 4
        hl, ok1 = self._one(self.Mhl, self.Mhl_abs, q, eps)
        ll, ok2 = self._one(self.Mll, self.Mll, q, eps)
        out = Vh + 2 * hl + ll
        ok = ok1 & ok2 & np.isfinite(out) & (np.abs(out) * TOL > 8 * CUT) & (np.abs(out - Vh) < 0.1 * np.abs(Vh))
        return np.where(ok, out, np.nan), ok

    def C(self, q, c):
        """(C(q, q, c q), ok) at arrays q, c."""
        q, c = np.broadcast_arrays(np.asarray(q, float), np.clip(np.asarray(c, float), -1, 1))
        sn = np.sqrt((1 - c) * (1 + c))
        th = np.arctan2(sn, c)
        V, okv = self.V(q)
        eps = TOL * np.where(okv, np.abs(V), 0) / 4
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            hl, ok1 = self._hl(q, c, sn, eps)
            ll, ok2 = self._ll(q, c, sn, eps)
        out = self._Ch(q, c, sn, th) + 2 * hl + ll
        ok = okv & ok1 & ok2 & np.isfinite(out) & (sn > 0)
        return np.where(ok, out, np.nan), ok

    def D(self, q, d):
        """(D(q, q, q12, d), ok) at arrays q, d = E[(u - v)^2] = 4 q sin^2(theta/2) (theta from d, not c)."""
        q, d = np.broadcast_arrays(np.asarray(q, float), np.asarray(d, float))
        h2 = np.clip(d / (4 * q), 0, 1)                       # sin^2(theta/2)
        th = 2 * np.arcsin(np.sqrt(h2))
        omc, c = 2 * h2, 1 - 2 * h2
        sn = 2 * np.sqrt(h2 * (1 - h2))
        Dh = self._Dh(q, th, omc)
        V, okv = self.V(q)
        eps = TOL * np.abs(Dh) / 16
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            hl, ok1 = self._one(self.Mhl, self.Mhl_abs, q, eps)
            ll, ok2 = self._one(self.Mll, self.Mll, q, eps)
            hlx, ok3 = self._hl(q, c, sn, eps)
            llx, ok4 = self._ll(q, c, sn, eps)
        corr = 4 * (hl - hlx) + 2 * (ll - llx)
        out = Dh + corr
        rounding = 1e-16 * (4 * (np.abs(hl) + np.abs(hlx)) + 2 * (np.abs(ll) + np.abs(llx)))
        ok = (ok1 & ok2 & ok3 & ok4 & np.isfinite(out) & (sn > 0) & (rounding + 8 * CUT <= TOL * np.abs(out))
              & (np.abs(corr) < 0.5 * Dh))
        return np.where(ok, out, np.nan), ok
