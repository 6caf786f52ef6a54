"""Two-input Gram ingredients that keep their digits as c -> 1 (docs/numerics.md section 8).

The finite-width recursion of sf.gram_fluctuations (docs/theory.md section 9.1) is carried in the
rotated basis of the two inputs,

    x = (u + v)/2,  y = u - v:   K~ = (E x^2, E y^2, E x y) = (xx, yy, xy),   yy = d = q_aa + q_bb - 2 q_ab,

entries ordered (xx, yy, xy) like (aa, bb, ab); the change of basis is linear (r = T g, :data:`T`), with
Psi_x = (psi(u) + psi(v))/2 and Psi_y = psi(u) - psi(v) in place of psi_a, psi_b. Two rules compute the
rotated ingredients directly, each entry to its own relative accuracy: ``arc-cosine`` (psi = alpha x +
beta |x|, polar coordinates) and ``mean-value`` (smooth psi, Price's theorem in (x, y), for d <= SMOOTH_D;
:meth:`NearRule.error` redoes the first and last layer with a finer rule). Other activations use the
(aa, bb, ab) ingredients, rotated (:func:`rotate_terms`), and flag the layers where that loses digits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import numpy as np
import sympy as sp

from symfield.numeric.evaluate import NUMPY_MODULES, evaluate, vectorised
from symfield.symbolic.activation import Activation, kinks
from symfield.symbolic.distance import d as DD, distance
from symfield.symbolic.formula import X
from symfield.symbolic.gaussian import homogeneous, q1 as Q1, q2 as Q2
from symfield.symbolic.kernel import kernel

XX, YY, XY = sp.symbols("xx yy xy", real=True)
RVARS = (XX, YY, XY)
T = np.array([[0.25, 0.25, 0.5], [1.0, 1.0, -2.0], [0.5, -0.5, 0.0]])     # (aa, bb, ab) -> (xx, yy, xy)
TI = np.array([[1.0, 0.25, 1.0], [1.0, 0.25, -1.0], [1.0, -0.25, 0.0]])   # its inverse (exact binary fractions)
SMOOTH_D = 0.05         # the mean-value rule is used for d <= SMOOTH_D (and d <= NEAR_C (q_aa + q_bb)/2)
NEAR_C = 0.5            # ... and both rules only where c >= 1/2, as the distance map (theory section 7)
Y_DIRECT = 0.1          # |y| above this: A_k as the plain difference (relative error ~ 1e-16/|y|)
N_Y, N_X, PIECE = 24, 16, 1.5
CHECK_TOL = 1e-10       # relative change allowed when the first and last layers are redone finer
ARC_K1_LOSS = 40 * 2.2e-16   # arc rule: relative error of K1's d entry ~ this x sqrt(q/d) (its d^(3/2) terms cancel)
ARC_NODES = 24


# ---------------------------------------------------------------- the change of basis
def _mat(K, M):
    return np.array([[M[i, j] * 1 for j in range(3)] for i in range(3)], dtype=K.dtype)


def rotate(K):
    """(aa, bb, ab) rows -> (xx, yy, xy) rows (float64 or object arrays)."""
    return np.asarray(K) @ _mat(np.asarray(K), T).T


def unrotate(Kr):
    return np.asarray(Kr) @ _mat(np.asarray(Kr), TI).T


def rotate_cov(V, M=T):
    """M V M^T for a stack of 3x3 matrices (default T: (aa, bb, ab) -> rotated)."""
    Mm = _mat(np.asarray(V), M)
    return np.einsum("ij,ljk,mk->lim", Mm, V, Mm)


def unrotate_cov(Vr):
    return rotate_cov(Vr, TI)


def rotate_terms(J, H, S):
    """Ingredients of the (aa, bb, ab) basis in the rotated one: J~ = T J T^-1, H~_r = sum_s T_rs T^-T H_s T^-1,
    Sigma~ = T Sigma T^T (stacks over layers)."""
    Tm, Ti = _mat(J, T), _mat(J, TI)
    Jr = np.einsum("ij,ljk,km->lim", Tm, J, Ti)
    Hr = np.einsum("rs,lsjk,ja,kb->lrab", Tm, H, Ti, Ti)
    return Jr, Hr, rotate_cov(S)


# ---------------------------------------------------------------- 1 - c and its derivatives
def _omega_forms():
    s = sp.sqrt((XX + YY / 4) ** 2 - XY ** 2)
    ab = XX - YY / 4
    pos = (XX * YY - XY ** 2) / (s * (s + ab))      # c > 0: det/(s (s + ab)), no cancellation as c -> 1
    neg = 1 - ab / s                                 # c <= 0
    out = []
    for w in (pos, neg):
        g = [sp.diff(w, v) for v in RVARS]
        h = [[sp.diff(gi, v) for v in RVARS] for gi in g]
        out.append((w, g, h))
    return out


@lru_cache(maxsize=2)
def _omega_fns(mp: bool):
    mods = "mpmath" if mp else "numpy"
    return [(sp.lambdify(RVARS, w, mods), sp.lambdify(RVARS, g, mods), sp.lambdify(RVARS, h, mods))
            for w, g, h in _omega_forms()]


def omega(Kr):
    """1 - c, its gradient (L, 3) and Hessian (L, 3, 3) in (xx, yy, xy), each without cancellation as c -> 1."""
    Kr = np.asarray(Kr)
    mp = Kr.dtype == object
    L = len(Kr)
    w, g, h = np.zeros(L, dtype=Kr.dtype), np.zeros((L, 3), dtype=Kr.dtype), np.zeros((L, 3, 3), dtype=Kr.dtype)
    fns = _omega_fns(mp)
    for i, (xx, yy, xy) in enumerate(Kr):
        f = fns[0] if xx - yy / 4 > 0 else fns[1]
        with np.errstate(all="ignore"):
            w[i] = f[0](xx, yy, xy)
            g[i] = np.array(f[1](xx, yy, xy), dtype=Kr.dtype)
            h[i] = np.array(f[2](xx, yy, xy), dtype=Kr.dtype)
    return w, g, h


# ---------------------------------------------------------------- rules
@dataclass(frozen=True)
class NearRule:
    """Rotated ingredients for one activation: ``near(Kr)`` marks the rows where the rule is used,
    ``second(Kr)`` gives F~ and ``terms(Kr)`` (F~, J~, H~, Sigma~) per unit sigma_w2."""
    method: str
    impl: object

    def near(self, Kr):
        Kr = np.asarray(Kr, dtype=float)
        a = Kr[:, 0] + Kr[:, 1] / 4
        ok = Kr[:, 1] <= NEAR_C * a
        return ok & (Kr[:, 1] <= SMOOTH_D) if isinstance(self.impl, _Smooth) else ok

    def second(self, Kr):
        return self.impl.second(np.asarray(Kr, dtype=float))

    def terms(self, Kr):
        return self.impl.terms(np.asarray(Kr, dtype=float))

    def estimate(self, Kr):
        """Per-row relative error estimate of the rotated recursion's entries (arc rule: K1's d entry,
        whose H:V terms of order d^(3/2) cancel to order d^2; measured 4.5e-9 at d/q = 2e-12)."""
        Kr = np.asarray(Kr, dtype=float)
        if isinstance(self.impl, _Smooth):
            return np.zeros(len(Kr))
        with np.errstate(divide="ignore"):
            return ARC_K1_LOSS * np.sqrt(Kr[:, 0] / Kr[:, 1])

    def error(self, Kr) -> float:
        """Largest relative change of the ingredients when the rows are redone with a finer rule."""
        fine = getattr(self.impl, "fine", None)
        if fine is None or len(Kr) == 0:
            return 0.0
        lo, hi = self.impl.terms(Kr), fine().terms(Kr)
        err = 0.0
        for a, b in zip(lo, hi):
            scale = np.abs(b).reshape(len(Kr), -1).max(axis=1)
            floor = 1e-30 * scale.reshape((-1,) + (1,) * (b.ndim - 1))
            err = max(err, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), floor + 1e-300))))
        return err


@lru_cache(maxsize=64)
def near_rule(act: Activation) -> NearRule | None:
    """The stable rule for ``act`` (module docstring, docs/numerics.md section 8), or None."""
    if act.pool is not None and act.k > 1:
        return None
    h = homogeneous(act.expr)
    if h is not None and h[0] == 1:
        arc = _arc_rule(act, h)
        if arc is not None:
            return NearRule("arc-cosine moments by arcs, distance-map derivatives in (xx, yy, xy)", arc)
    if not kinks(act.expr) and h is None:
        return NearRule("mean-value rule (Price's theorem in x = (u + v)/2, y = u - v)", _Smooth(act.expr))
    return None


# ---------------------------------------------------------------- arc-cosine family
def _rotated(expr):
    """An expression in (q1, q2, d) written in (xx, yy, xy)."""
    return expr.subs({Q1: XX + XY + YY / 4, Q2: XX - XY + YY / 4, DD: YY}, simultaneous=True)


def _arc_rule(act, h):
    dist = distance(kernel(act))
    if not dist.stable or dist.near is None:
        return None
    D = _rotated(dist.near)
    grad = tuple(sp.diff(D, v) for v in RVARS)
    hess = tuple(tuple(sp.diff(g, v) for v in RVARS) for g in grad)
    exprs = (D,) + grad + tuple(hess[i][j] for i in range(3) for j in range(i, 3))
    if not _stable(exprs):
        return None
    _, a, b = h
    alpha, beta = float((a + b) / 2), float((b - a) / 2)
    return _Arc(exprs, alpha, beta)


def _stable(exprs) -> bool:
    """Every expression in float64 within 1e-11 (relative) of its 60-digit value at equal norms, d/q down to 1e-200."""
    for qv in (0.37, 2.9):
        for ratio in (1e-3, 1e-9, 1e-30, 1e-200):
            dv = qv * ratio
            vals = (qv - dv / 4, dv, 0.0)            # xx = q - d/4 at q_aa = q_bb = q
            for e in exprs:
                got = float(evaluate(e, RVARS, vals))
                with mpmath.workdps(60):
                    ref = evaluate(e, RVARS, tuple(mpmath.mpf(v) for v in (repr(qv - dv / 4), repr(dv), "0")), (), 50)
                if not (abs(got - ref) <= 1e-11 * abs(ref) or (ref == 0 and got == 0)):
                    return False
    return True


class _Arc:
    def __init__(self, exprs, alpha, beta):
        self.exprs, self.p, self.m = exprs, alpha + beta, alpha - beta
        self.kappa = alpha * alpha + beta * beta
        self.tau, self.wt = np.polynomial.legendre.leggauss(ARC_NODES)

    def _moments(self, Kr, orders):
        """E[Psi_x^i Psi_y^j] for (i, j) in orders, rows of Kr."""
        xx, yy, xy = Kr[:, 0], Kr[:, 1], Kr[:, 2]
        a, b = xx + xy + yy / 4, xx - xy + yy / 4
        sa, sb = np.sqrt(a), np.sqrt(b)
        R = np.sqrt((xx + yy / 4) ** 2 - xy ** 2)
        dsq = 2 * xy / (sa + sb)                                      # sqrt(a) - sqrt(b)
        e = np.maximum(yy - dsq * dsq, 0.0)
        th = (2 * np.arctan2(np.sqrt(e), np.sqrt(np.maximum(4 * R - e, 0.0))))[:, None]
        tp, tm, w = (1 + self.tau) / 2, (1 - self.tau) / 2, self.wt / (4 * np.pi)
        sa, sb, dsq = sa[:, None], sb[:, None], dsq[:, None]
        u1, v1 = sa * np.sin(th * tp), -sb * np.sin(th * tm)           # arc (-pi/2, theta - pi/2): u > 0 > v
        phi = (np.pi - th) * self.tau / 2                              # arc (theta - pi/2, pi/2): u, v > 0
        u2, v2 = sa * np.cos(phi + th / 2), sb * np.cos(phi - th / 2)
        diff2 = dsq * np.cos(phi + th / 2) - 2 * sb * np.sin(phi) * np.sin(th / 2)
        p, m = self.p, self.m
        arcs = [((p * u1 + m * v1) / 2, p * u1 - m * v1, th * w),           # arc 1
                (p * (u2 + v2) / 2, p * diff2, (np.pi - th) * w),           # arc 2
                (-(m * u1 + p * v1) / 2, -(m * u1 - p * v1), th * w),       # arc 3: (u, v) -> (-u, -v) of arc 1
                (-m * (u2 + v2) / 2, -m * diff2, (np.pi - th) * w)]         # arc 4: of arc 2
        out = {}
        for i, j in orders:
            radial = 2.0 if i + j == 2 else 8.0                               # E r^2, E r^4
            out[i, j] = radial * sum((W * px ** i * py ** j).sum(axis=1) for px, py, W in arcs)
        return out

    def _F(self, Kr, D):
        """F~ = (kappa (xx + yy/4) - D/4, D, kappa xy): V(q) = kappa q is linear, so F~_xy is exactly 0 at equal norms."""
        return np.stack([self.kappa * (Kr[:, 0] + Kr[:, 1] / 4) - D / 4, D, self.kappa * Kr[:, 2]], axis=1)

    def second(self, Kr):
        with np.errstate(all="ignore"):
            D = np.broadcast_to(evaluate(self.exprs[0], RVARS, (Kr[:, 0], Kr[:, 1], Kr[:, 2])), (len(Kr),))
        return self._F(Kr, D)

    def terms(self, Kr):
        L = len(Kr)
        orders = [(2, 0), (0, 2), (1, 1), (4, 0), (0, 4), (2, 2), (3, 1), (1, 3)]   # Sigma~ from one rule
        mo = self._moments(Kr, orders)
        with np.errstate(all="ignore"):
            vals = [np.broadcast_to(evaluate(e, RVARS, (Kr[:, 0], Kr[:, 1], Kr[:, 2])), (L,)) for e in self.exprs]
        gD = np.stack(vals[1:4], axis=1)
        hD = np.zeros((L, 3, 3))
        for n, (i, j) in enumerate((i, j) for i in range(3) for j in range(i, 3)):
            hD[:, i, j] = hD[:, j, i] = vals[4 + n]
        F = self._F(Kr, vals[0])
        J = np.zeros((L, 3, 3))
        J[:, 0] = self.kappa * np.array([1.0, 0.25, 0.0]) - gD / 4
        J[:, 1] = gD
        J[:, 2, 2] = self.kappa
        H = np.zeros((L, 3, 3, 3))
        H[:, 0], H[:, 1] = -hD / 4, hD
        return F, J, H, _sigma(np.stack([mo[2, 0], mo[0, 2], mo[1, 1]], axis=1), mo)


def _sigma(F, mo):
    """Sigma~ = Cov(Psi_x^2, Psi_y^2, Psi_x Psi_y) from the fourth moments and F~."""
    xx, yy, xy = F[:, 0], F[:, 1], F[:, 2]
    S = np.zeros((len(F), 3, 3))
    S[:, 0, 0] = mo[4, 0] - xx * xx
    S[:, 1, 1] = mo[0, 4] - yy * yy
    S[:, 2, 2] = mo[2, 2] - xy * xy
    S[:, 0, 1] = S[:, 1, 0] = mo[2, 2] - xx * yy
    S[:, 0, 2] = S[:, 2, 0] = mo[3, 1] - xx * xy
    S[:, 1, 2] = S[:, 2, 1] = mo[1, 3] - yy * xy
    return S


# ---------------------------------------------------------------- smooth activations
_NK = 7
_S = sp.symbols(f"S0:{_NK}")
_A = sp.symbols(f"A0:{_NK}")


def _dx(P):
    return sum(sp.diff(P, _S[k]) * _S[k + 1] + sp.diff(P, _A[k]) * _A[k + 1] for k in range(_NK - 1))


def _dy(P):
    return sum(sp.diff(P, _S[k]) * _A[k + 1] / 4 + sp.diff(P, _A[k]) * _S[k + 1] for k in range(_NK - 1))


def _dk(P, i):
    """dE[P]/dK~_i as the integrand: P_xx/2, P_yy/2, P_xy for i = 0, 1, 2."""
    return (_dx(_dx(P)) / 2, _dy(_dy(P)) / 2, _dx(_dy(P)))[i]


@lru_cache(maxsize=1)
def _smooth_polys():
    """Integrands (polynomials in S_k, A_k) of F~ (3), J~ (3x3), H~ (3x3x3) and E[P_r P_s] (3x3)."""
    P = (_S[0] ** 2, _A[0] ** 2, _S[0] * _A[0])
    F = [sp.expand(p) for p in P]
    J = [[sp.expand(_dk(p, i)) for i in range(3)] for p in P]
    H = [[[sp.expand(_dk(_dk(p, i), j)) for j in range(3)] for i in range(3)] for p in P]
    M = [[sp.expand(p * r) for r in P] for p in P]
    return F, J, H, M


@lru_cache(maxsize=2)
def _smooth_table(full: bool):
    """(exponents (n_mon, 2 _NK), odd-in-A mask, coefficient matrix (n_quantities, n_mon)) of the integrands:
    F~ (3) only, or F~ (3), J~ (9), H~ (27) and E[P_r P_s] (9) in that order."""
    Fp, Jp, Hp, Mp = _smooth_polys()
    polys = Fp if not full else Fp + [p for r in Jp for p in r] + [p for r in Hp for s in r for p in s] + \
        [p for r in Mp for p in r]
    terms = [sp.Poly(p, *_S, *_A).terms() if p != 0 else [] for p in polys]
    mons = sorted({m for t in terms for m, _ in t})
    index = {m: i for i, m in enumerate(mons)}
    coef = np.zeros((len(polys), len(mons)))
    for r, t in enumerate(terms):
        for m, c in t:
            coef[r, index[m]] = float(c)
    exps = np.array(mons, dtype=int).reshape(len(mons), 2 * _NK)
    return exps, exps[:, _NK:].sum(axis=1) % 2 == 1, coef


class _Smooth:
    def __init__(self, phi, n_y=N_Y, n_x=N_X, piece=PIECE):
        self.phi, self.n_y, self.n_x, self.piece = phi, n_y, n_x, piece
        self.d = [vectorised(sp.diff(phi, X, k), NUMPY_MODULES) for k in range(_NK - 1)]
        w, W = np.polynomial.hermite_e.hermegauss(n_y)
        self.w, self.W = w, W / math.sqrt(2 * math.pi)
        self.t, self.tw = np.polynomial.legendre.leggauss(6)
        self.t, self.tw = self.t / 2, self.tw / 2

    def fine(self):
        return _Smooth(self.phi, self.n_y + 8, self.n_x + 4, self.piece * 0.6)

    def _nodes(self, k):
        """x, y and weights of the product rule for the row k = (xx, yy, xy)."""
        xx, yy, xy = k
        sy = math.sqrt(max(yy, 0.0))
        rho = xy / yy if yy > 0 else 0.0
        sx = math.sqrt(max(xx - rho * xy, 0.0))
        hz = min(self.piece, self.piece / sx) if sx > 0 else 18.0
        m = max(1, math.ceil(18.0 / hz))
        edges = np.linspace(-9.0, 9.0, m + 1)
        t, tw = np.polynomial.legendre.leggauss(self.n_x)
        half = (edges[1:] - edges[:-1]) / 2
        z = ((edges[:-1] + edges[1:]) / 2)[:, None] + half[:, None] * t
        zw = (half[:, None] * tw) * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        y = sy * self.w
        x = rho * y[:, None] + sx * z.ravel()[None, :]
        return x.ravel(), np.repeat(y, z.size), (self.W[:, None] * zw.ravel()[None, :]).ravel()

    def _base(self, x, y, kmax):
        """S_k and A_k (k <= kmax) at the nodes, A_k by its mean-value form where |y| < Y_DIRECT."""
        S, A = [], []
        small = np.abs(y) < Y_DIRECT
        xs, ys = x[small], y[small]
        pts = xs[:, None] + np.outer(ys, self.t)
        for k in range(kmax + 1):
            hi, lo = self.d[k](x + y / 2), self.d[k](x - y / 2)
            S.append((hi + lo) / 2)
            a = hi - lo
            if small.any():
                a[small] = ys * (self.d[k + 1](pts) @ self.tw)
            A.append(a)
        return S, A

    def _expect(self, k, full):
        """The integrand table's quantities at one row k = (xx, yy, xy)."""
        exps, odd, coef = _smooth_table(full)
        kmax = 4 if full else 0
        x, y, w = self._nodes(k)
        S, A = self._base(x, y, kmax)
        base = S + [None] * (_NK - len(S)) + A + [None] * (_NK - len(A))
        vals = np.zeros(len(exps))
        for i, mon in enumerate(exps):
            if odd[i] and k[2] == 0:          # equal norms: y -> -y flips the A's, odd monomials vanish exactly
                continue
            prod = w
            for j in np.flatnonzero(mon):
                prod = prod * (base[j] if mon[j] == 1 else base[j] ** mon[j])
            vals[i] = prod.sum()
        return coef @ vals

    def second(self, Kr):
        return np.array([self._expect(tuple(k), False) for k in Kr]).reshape(len(Kr), 3)

    def terms(self, Kr):
        L = len(Kr)
        out = np.array([self._expect(tuple(k), True) for k in Kr]).reshape(L, -1)
        F, J, H, M = out[:, :3], out[:, 3:12].reshape(L, 3, 3), out[:, 12:39].reshape(L, 3, 3, 3), \
            out[:, 39:48].reshape(L, 3, 3)
        return F, J, H, M - F[:, :, None] * F[:, None, :]
