"""The max-pool covariance E[f(M_u) g(M_v)] by Hoeffding's identity: a 2-D rule over the thresholds (float64).

M_u = max_j u_j, M_v = max_j v_j for k i.i.d. pairs (u_j, v_j) ~ N(0, [[q1, q12], [q12, q2]]). For f, g absolutely
continuous (f' and g' finite; kinks allowed), f(x) = f(0) + int f'(a) (1[x > a] - 1[0 > a]) da gives

    E[f(M_u)] = f(0) + int f'(a) (1[a > 0] - N(a/s1)^k) da,
    E[f(M_u) g(M_v)] = E[f(M_u)] E[g(M_v)] + int int f'(a) g'(b) D(a/s1, b/s2) da db,
    D(x, y) = F(x, y; c)^k - N(x)^k N(y)^k,      F - N(x) N(y) = P(x, y; c) = (1/2 pi) int_0^asin(c)
              exp(-(x^2 + y^2 - 2 x y sin t) / (2 cos^2 t)) dt                            (Plackett),

s_i = sqrt(q_i), c = q12/(s1 s2), F the bivariate normal CDF (P(M_u <= a, M_v <= b) = F^k). Every factor is smooth
away from f's and g's kinks, D decays as a Gaussian in x and y, and nothing needs Owen's T.

Rule: in a (and likewise b) Gauss-Legendre panels from 0 (the kink of 1[a > 0]) and the kinks outwards, each at
most min(H_GAUSS, H_RIDGE sqrt(1 - c^2)) s wide (D's scale, and its ridge as |c| grows) and at most H0 + G |a|
(phi's features at unit scale in x, as the rest of symfield.numeric.quadrature assumes; tanh's poles at +-i pi/2
set H0), out to where N(a/s)^k resp. 1 - N(a/s)^k falls below 1e-17 and |f'| below 1e-13 max |f'| (sampled on
[-40, 40]); in t, Gauss-Legendre with 5..12 points by |c| (Genz's choice for the BVN CDF), or for k = 2 and
|c| <= MEHLER_C the Mehler series. Used for |c| <= C_MAX; measured against finer rules and the
argmax-decomposition oracle in tests/numeric/test_pool_hoeffding.py.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

C_MAX = 0.925            # |c| above: D's ridge (width sqrt(1 - c^2)) and the t-integrand steepen; max_expect2 there
N_PANEL = 16             # Gauss-Legendre points per panel
H_GAUSS, H_RIDGE = 3.5, 4.0   # panel width <= min(H_GAUSS, H_RIDGE sqrt(1 - c^2)) s (D's scale in x = a/s)
H0, G = 3.0, 1.0         # ... and <= H0 + G |a| (phi's scale)
EPS_TAIL = 1e-17         # truncation of N^k and 1 - N^k
F_TAIL = 1e-13           # f' negligible beyond where |f'| < F_TAIL max |f'|
GROWTH = 6               # |f'| may grow like |a|^GROWTH at most (f'(40) <= 2^GROWTH f'(20))
SIDES = 256              # node sets kept per rule (q values)
R = 40.0                 # f' is sampled on [-R, R] (step 1/2) for its reach
_T, _W = np.polynomial.legendre.leggauss(N_PANEL)


@lru_cache(maxsize=64)
def _theta_rule(n):
    return np.polynomial.legendre.leggauss(n)


def _theta_points(c):
    a = abs(c)
    return 5 if a < 0.3 else 7 if a < 0.5 else 9 if a < 0.75 else 12


def reach(fp):
    """(A-, A+): f' is below F_TAIL max |f'| on [-R, -A-) and (A+, R] (inf where it is not, up to R).
    ValueError where f' is not finite there, or grows faster than |a|^GROWTH (D's Gaussian tail cut at 1e-17 must
    stay negligible against f')."""
    t = np.arange(0.0, R + 0.25, 0.5)
    out = []
    for side in (-1.0, 1.0):
        v = np.abs(np.asarray(fp(side * t), dtype=float))
        if not np.isfinite(v).all():
            raise ValueError("f' is not finite on [-40, 40]")
        out.append(v)
    top = max(float(v.max()) for v in out)
    res = []
    for v in out:
        if v[-1] > 2.0 ** GROWTH * max(v[v.size // 2], F_TAIL * top):
            raise ValueError("f' grows faster than a power of |a|")
        big = np.flatnonzero(v > F_TAIL * top)
        res.append(math.inf if big.size and big[-1] == v.size - 1 else (t[big[-1]] + 1.0 if big.size else 1.0))
    return tuple(res)


def _side(A, s, hx):
    """Breakpoints 0 = x_0 < ... < x_m = A: steps min(hx s, H0 + G x)."""
    pts, x, hs = [0.0], 0.0, hx * s
    while x < A:
        step = min(hs, H0 + G * x)
        x = A if x + 1.25 * step >= A else x + step
        pts.append(x)
    return pts


def breakpoints(s, k, reach_f, kinks=(), hx=H_GAUSS):
    """Sorted panel ends in a for scale s, panels at most hx s wide (module docstring)."""
    from scipy.special import ndtri     # noqa: PLC0415 (scipy loads in ~0.3 s: only when a rule is built)
    hi = min(float(-ndtri(EPS_TAIL / k)) * s, reach_f[1])
    lo = min(float(-ndtri(EPS_TAIL ** (1.0 / k))) * s, reach_f[0])
    b = [-x for x in reversed(_side(lo, s, hx)[1:])] + _side(hi, s, hx)
    b += [x for x in kinks if -lo < x < hi]
    return np.unique(np.asarray(b, dtype=float))


def nodes(b):
    hw = 0.5 * np.diff(b)[:, None]
    return (b[:-1, None] + hw * (1 + _T)).ravel(), (hw * _W).ravel()


class Side:
    """Nodes of one input: a, weights w f'(a), x = a/s, N(x)^k, and the mean E[f(M)] = f(0) + sum w f' (1[a > 0] - N^k)."""

    def __init__(self, fp, f0, q, k, reach_f, kinks=(), hx=H_GAUSS):
        s = math.sqrt(q)
        a, w = nodes(breakpoints(s, k, reach_f, kinks, hx))
        u = w * np.asarray(fp(a), dtype=float)
        keep = u != 0
        self.a, self.u = a[keep], u[keep]
        self.x = self.a / s
        from scipy.special import ndtr     # noqa: PLC0415
        self.N = ndtr(self.x)
        Nk = self.N ** k
        self.mean = f0 + float(np.dot(self.u, np.where(self.a > 0, 1.0 - Nk, -Nk)))


def plackett(x, y, c):
    """P(x_i, y_j; c) = F - N(x) N(y) on the grid x (n,), y (m,), |c| < 1: Gauss-Legendre in t over [0, asin c],
    exp(-(x^2 + y^2 - 2 x y s)/(2 cos^2 t)) = e^{-h x^2} e^{-h y^2} e^{2 h s x y}."""
    tc = math.asin(c)
    t, w = _theta_rule(_theta_points(c))
    sn = np.sin(0.5 * tc * (1 + t))
    h = 0.5 / (1 - sn * sn)                     # 1 / (2 cos^2 t)
    ex = np.exp(-np.multiply.outer(h, x * x))
    ey = np.exp(-np.multiply.outer(h, y * y)) * (0.25 * tc / math.pi * w)[:, None]   # (tc/2) w / (2 pi)
    xy = np.multiply.outer(x, y)
    P, tmp = np.zeros_like(xy), np.empty_like(xy)
    for m in range(t.size):
        np.multiply(xy, 2 * h[m] * sn[m], out=tmp)
        np.exp(tmp, out=tmp)
        tmp *= ex[m][:, None]
        tmp *= ey[m]
        P += tmp
    return P


MEHLER_C = 0.55          # k = 2 and |c| <= this: the Mehler series (rank-J, no 2-D exponentials)
MEHLER_TOL = 1e-17


def _hermite_functions(z, J):
    """psi_m(z) = n(z) He_m(z)/sqrt(m!), m < J (rows), by the three-term recurrence of He (|z| <= 9, J <= 80:
    He_m stays below 1e130)."""
    H = np.empty((J, z.size))
    H[0] = 1.0
    if J > 1:
        H[1] = z
    for m in range(1, J - 1):
        np.multiply(z, H[m], out=H[m + 1])
        H[m + 1] -= m * H[m - 1]
    H *= _INV_SQRT_FACT[:J, None]
    H *= np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return H


_INV_SQRT_FACT = np.exp(-0.5 * np.cumsum(np.log(np.maximum(np.arange(120), 1.0))))


def mehler_terms(c):
    """J with |c|^(J+1)/(J+1) <= MEHLER_TOL: the terms P = sum_{m < J} c^(m+1)/(m+1) psi_m(x) psi_m(y) kept."""
    a, J = abs(c), 1
    while a ** (J + 1) / (J + 1) > MEHLER_TOL:
        J += 1
    return J


def covariance_mehler(A: Side, B: Side, c):
    """k = 2: sum_ij u_i v_j (P^2 + 2 P N N)_ij with P = sum_m c^(m+1)/(m+1) psi_m(x) psi_m(y) (Mehler's series
    integrated over the correlation from 0 to c): rank J, so the double sum is J x J matrix products."""
    J = mehler_terms(c)
    H = _hermite_functions(np.concatenate([A.x, B.x]), J)
    Hx, Hy = H[:, :A.x.size], H[:, A.x.size:]
    cm = c ** np.arange(1, J + 1) / np.arange(1, J + 1)
    Ax = (Hx * A.u) @ Hx.T
    By = (Hy * B.u) @ Hy.T
    cross = 2.0 * float(np.dot(cm * (Hx @ (A.u * A.N)), Hy @ (B.u * B.N)))
    return float(cm @ (Ax * By) @ cm) + cross


def covariance(A: Side, B: Side, c, k):
    """E[f(M_u) g(M_v)] - E[f(M_u)] E[g(M_v)] = sum_ij u_i v_j D(x_i, y_j)."""
    if c == 0 or A.u.size == 0 or B.u.size == 0:
        return 0.0
    if k == 2 and abs(c) <= MEHLER_C:
        return covariance_mehler(A, B, c)
    P = plackett(A.x, B.x, c)
    NN = np.multiply.outer(A.N, B.N)
    D = P * (P + 2 * NN) if k == 2 else (NN + P) ** k - NN ** k
    return float(A.u @ D @ B.u)


class Max2:
    """E[f(M_u) g(M_v)] (MAX2 integrals) in float64 for |c| <= C_MAX; ``fp``, ``gp`` vectorised f', g';
    ``f0``, ``g0`` the values f(0), g(0)."""

    def __init__(self, fp, gp, f0, g0, k, kinks=()):
        self.fp, self.gp, self.f0, self.g0, self.k = fp, gp, float(f0), float(g0), int(k)
        self.kinks = tuple(float(v) for v in kinks)
        self.same = gp is fp and self.f0 == self.g0          # f = g: one node set per q serves both inputs
        self.reach_f = reach(fp)
        self.reach_g = self.reach_f if gp is fp else reach(gp)
        self._sides: dict = {}

    def side(self, which, q, hx=H_GAUSS):
        """The nodes of input ``which`` (0: f at q1, 1: g at q2), kept for the last SIDES (q, hx) (grids repeat q)."""
        key = (0 if self.same else which, q, hx)
        out = self._sides.get(key)
        if out is None:
            fp, f0, rf = (self.fp, self.f0, self.reach_f) if key[0] == 0 else (self.gp, self.g0, self.reach_g)
            if len(self._sides) >= SIDES:
                self._sides.clear()
            out = self._sides[key] = Side(fp, f0, q, self.k, rf, self.kinks, hx)
        return out

    def __call__(self, q1, q2, q12):
        q1, q2, q12 = float(q1), float(q2), float(q12)
        c = q12 / math.sqrt(q1 * q2)
        if not abs(c) <= C_MAX * (1 + 1e-12):       # (callers test |q12| <= C_MAX sqrt(q1 q2): ulps apart)
            raise ValueError(f"Hoeffding max-pool rule: |c| = {abs(c):g} > {C_MAX}")
        hx = min(H_GAUSS, H_RIDGE * math.sqrt(max(1 - c * c, 0.0)))
        A, B = self.side(0, q1, hx), self.side(1, q2, hx)
        return A.mean * B.mean + covariance(A, B, c, self.k)
