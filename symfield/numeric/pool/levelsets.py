"""Max-pool of a NON-monotone phi: generalised order statistics on the level sets of phi.

psi(u) = max_j phi(u_j) over k i.i.d. nodes equals phi(u_A), A the argmax node. With the sublevel sets
A(y) = {x : phi(x) <= y} (one interval per monotone piece of phi) and F_q(y) = P(sqrt(q) z in A(y)),

    E[f(u_A)] = k E[f(u) F_q(phi(u))^(k-1)],   u ~ N(0, q),
    E[f(u_A) g(v_B)] = k E[f g H(phi(u), phi(v))^(k-1)] + k(k-1) E[f g H^(k-2) P1 P2]   (u, v independent),

H(a, b) = P(u' in A(a), v' in A(b)) for one node pair, P1, P2 the conditional probabilities that the
other node of each pair stays below the winner; dC = k E[phi'(u) phi'(v) H^(k-1)]. For monotone phi these
are the order-statistic formulas (h_k) of docs/theory.md section 4.

Level sets, singular points, the rules near |c| = 1, flat pieces, the mpmath path and the measured
accuracy: docs/numerics.md section 5.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, PrecisionError
import math
from fractions import Fraction
from functools import lru_cache

import mpmath
import numpy as np
from mpmath.libmp import to_fixed
from mpmath.libmp.libelefun import exp_fixed, ln2_fixed

from symfield.numeric.quadrature import GUARD, QuadratureError, bvn_cdf, controlled
from symfield.core import caches

L_INT = 9.0                  # integration range in standard units
L_DOM = 10.0                 # level-set domain [-X, X], X = L_DOM sd; boundaries beyond -> +-inf
H_ACT = (1.0, 0.5, 0.25, 0.125)   # candidate activation grid spacings (argument units), see Levels.h
R_ACT = 40.0                 # ... on [-R_ACT, R_ACT]
MAX_PIECES = 128             # monotone pieces of phi on [-X, X] the rule resolves (sin: q up to ~160)
H_SCAN = 1 / 64              # finest scan step for phi's turning points (coarser beyond X = 1024: 2^17 points)
BAND = np.array([0.0, 1, -1, 2, -2, 3, -3, 4.5, -4.5, 6.5, -6.5, 9, -9])   # transition grid (z units)
C_EDGE = 1e-13               # |c| = 1: C evaluated at |c| (1 - C_EDGE)
_GT, _GW = np.polynomial.legendre.leggauss(10)
_POW2 = 2.0 ** np.arange(1, 31)
_GL12 = np.polynomial.legendre.leggauss(12)
_SQ2PI = math.sqrt(2 * math.pi)


def _de_rule(h=1 / 7, T=3.2):
    """tanh-sinh nodes on [0, 1] as (fraction from the left end, weight)."""
    t = np.arange(-round(T / h), round(T / h) + 1) * h
    y = 0.5 * math.pi * np.sinh(t)
    frac = 0.5 * (1 + np.tanh(y))
    w = 0.5 * h * 0.5 * math.pi * np.cosh(t) / np.cosh(y) ** 2
    return frac, w


_DF, _DW = _de_rule()
_DF2, _DW2 = _de_rule(1 / 14, 3.6)          # doubled resolution (tests)
OUTER_TOL = 1e-12            # adaptive outer rule of the 2-D maps: |K15 - G7| <= OUTER_TOL * S per panel
OUTER_LEVELS = 40            # ... at most this many halvings, else QuadratureError
RES = {"gl": (_GT, _GW), "de": (_DF, _DW), "outer_tol": OUTER_TOL}   # the active rules; `refined()` swaps in finer ones


class refined:
    """Context manager: 16-point Gauss-Legendre, half-step tanh-sinh and an outer tolerance 100 times
    smaller (a second resolution for tests)."""

    def __enter__(self):
        self.saved = dict(RES)
        RES["gl"] = np.polynomial.legendre.leggauss(16)
        RES["de"] = (_DF2, _DW2)
        RES["outer_tol"] = OUTER_TOL / 100

    def __exit__(self, *exc):
        RES.update(self.saved)


# ---------------------------------------------------------------- composite rules on rows
def _panels(E, S=None):
    """Panels of a composite rule on each row of edges E (R, M) (any order; duplicates allowed).
    S (R, m): singular points per row.  Edges within 1e-3 of a singular point count as singular;
    beyond the nearest other edge (distance d) the points S +- d 2^j (up to distance 1) grade the
    mesh, so every regular panel lies at least its own width away from S.
    Returns (a, width, singular), each (R, M'): left ends, widths (0: unused), a singular end."""
    tol = 1e-3
    sing_pts = []
    if S is not None and S.size:
        G = [E]
        lo, hi = E.min(axis=1, keepdims=True), E.max(axis=1, keepdims=True)
        for j in range(S.shape[1]):
            sj = S[:, j:j + 1]
            sj = np.where((sj > lo) & (sj < hi), sj, np.nan)    # only singular points inside the row's range
            dist = np.abs(E - sj)
            with np.errstate(invalid="ignore"):
                d = np.minimum(np.min(np.where(dist > tol, dist, np.inf), axis=1, keepdims=True), 1.0)
            steps = np.minimum(d * _POW2[None, :], 1.0)
            G += [np.clip(sj - steps, lo, hi), np.clip(sj + steps, lo, hi)]
            sing_pts.append(sj)
        E = np.concatenate(G, axis=1)
    E = np.sort(E, axis=1)
    a, b = E[:, :-1], E[:, 1:]
    wid = b - a
    sing = np.zeros(a.shape, bool)
    with np.errstate(invalid="ignore"):
        wid = np.where(np.isnan(wid), 0.0, wid)                 # nan points (unused singular slots) sort last
        for sj in sing_pts:
            sing |= (np.abs(a - sj) <= tol) | (np.abs(b - sj) <= tol)
    return a, wid, sing


def rows_rule(E, S=None):
    """Nodes of a composite rule on each row of edges E (R, M) with singular points S (R, m) (see
    :func:`_panels`): Gauss-Legendre on regular panels, tanh-sinh on panels with a singular end
    (measured: 5e-12 for (x + d)^0.05 with d <= 1e-2 on [0, 1]).  Returns flat arrays (row, x, w)."""
    a, wid, sing = _panels(E, S)
    T, W = RES["gl"]
    r, p = np.nonzero((wid > 0) & ~sing)
    a0, hw = a[r, p], 0.5 * wid[r, p]
    x1 = (a0[:, None] + hw[:, None] * (1 + T)).ravel()
    w1 = (hw[:, None] * W).ravel()
    r1 = np.repeat(r, T.size)
    DF, DW = RES["de"]
    r, p = np.nonzero((wid > 0) & sing)
    a0, wd = a[r, p], wid[r, p]
    x2 = (a0[:, None] + wd[:, None] * DF).ravel()
    w2 = (wd[:, None] * DW).ravel()
    r2 = np.repeat(r, DF.size)
    return np.concatenate([r1, r2]), np.concatenate([x1, x2]), np.concatenate([w1, w2])


def _ndiff(a, b):
    """N(b) - N(a) for a <= b (elementwise), accurate in both tails (N(-a) - N(-b) when a > 0)."""
    from scipy.special import ndtr
    sg = np.where(a > 0, -1.0, 1.0)
    with np.errstate(invalid="ignore"):
        return sg * (ndtr(sg * b) - ndtr(sg * a))


# ---------------------------------------------------------------- level sets of phi
class Levels:
    """Monotone pieces of phi on [-X, X] and the sublevel sets A(y) = {phi <= y} (float64)."""

    def __init__(self, phi, dphi, kinks, X):
        self.phi, self.dphi, self.X = phi, dphi, float(X)
        X = self.X
        h = max(min(H_SCAN, X / 1024), X / 65536)     # at most 2^17 scan points (q > ~1e4: coarser than H_SCAN)
        xs = np.linspace(-X, X, int(math.ceil(2 * X / h)) + 1)
        kk = np.array(sorted(float(k) for k in kinks if -X < k < X))
        with np.errstate(all="ignore"):
            d = np.asarray(dphi(xs), float)
        d = np.where(np.isfinite(d), d, 0.0)
        sg = np.sign(d)
        nz = np.nonzero(sg)[0]
        ch = np.nonzero(sg[nz[:-1]] != sg[nz[1:]])[0]
        lo, hi = xs[nz[ch]], xs[nz[ch + 1]]
        if ch.size >= MAX_PIECES or (h > H_SCAN and ch.size > 1 and np.diff(lo).min() < 8 * h):
            raise QuadratureError(f"max-pool of a non-monotone activation: phi has {ch.size + 1} or more monotone "
                                  f"pieces on |x| <= {X:g} (q up to about {(X / L_DOM) ** 2:.3g}); the level-set "
                                  f"rule resolves at most {MAX_PIECES}, each at least 8 scan steps wide")
        turn = np.empty(lo.size)
        for i in range(lo.size):       # a kink in the bracket is the turning point (abs at 0)
            kin = kk[(kk >= lo[i]) & (kk <= hi[i])]
            turn[i] = kin[0] if kin.size else np.nan
        todo = np.isnan(turn)
        if todo.any():
            a, b = lo[todo], hi[todo]
            sa = np.sign(dphi(a))
            for _ in range(64):
                m = 0.5 * (a + b)
                same = np.sign(dphi(m)) == sa
                a, b = np.where(same, m, a), np.where(same, b, m)
            turn[todo] = 0.5 * (a + b)
        self.turn = np.unique(turn)
        e = np.concatenate([[-X], self.turn, [X]])
        self.l, self.r = e[:-1], e[1:]
        self.yl, self.yr = np.asarray(phi(self.l), float), np.asarray(phi(self.r), float)
        self.P = self.l.size
        self.kinks = kk
        self.h = _act_spacing(phi, dphi, kk)
        self.tab = []
        for p in range(self.P):
            inside = (xs > self.l[p]) & (xs < self.r[p])
            xt = np.unique(np.concatenate([[self.l[p]], xs[inside], kk[(kk > self.l[p]) & (kk < self.r[p])], [self.r[p]]]))
            o = 1.0 if self.yr[p] >= self.yl[p] else -1.0
            yt = o * np.asarray(phi(xt), float)
            if np.any(np.diff(yt) < -1e-9 * (1 + np.abs(yt[1:]))):
                raise InvalidValue(f"The activation oscillates faster than the level-set scan (spacing {h:g}) resolves; "
                                 "max-pool of it is not supported.")
            with np.errstate(all="ignore"):
                st = o * np.asarray(dphi(xt), float)        # slopes for a cubic Hermite first guess
            st = np.where(np.isfinite(st) & (st > 0), st, 0.0)
            self.tab.append((xt, np.maximum.accumulate(yt), o, st))
        self._special()

    # -- inversion
    def invert(self, p, a):
        """x in piece p with phi(x) = a (a strictly between the piece's end values)."""
        xt, yt, o, st = self.tab[p]
        a = np.asarray(a, float)
        j = np.clip(np.searchsorted(yt, o * a), 1, xt.size - 1)
        lo, hi = xt[j - 1].copy(), xt[j].copy()
        dy = yt[j] - yt[j - 1]
        with np.errstate(all="ignore"):
            # x(y) on the cell as a cubic Hermite interpolant (slopes 1/phi'), clipped to the cell
            tt = np.clip(np.where(dy > 0, (o * a - yt[j - 1]) / dy, 0.5), 0, 1)
            dx = hi - lo
            m0, m1 = dy / (st[j - 1] * dx), dy / (st[j] * dx)
            ok = np.isfinite(m0) & np.isfinite(m1) & (m0 < 8) & (m1 < 8)
            h = tt * tt * (3 - 2 * tt) + np.where(ok, (tt ** 3 - 2 * tt * tt + tt) * m0 + (tt ** 3 - tt * tt) * m1, 0.0)
            x = lo + dx * np.clip(h, 0, 1)
            x = np.where(ok, x, lo + dx * tt)
        act = np.arange(a.size)
        for _ in range(100):
            xa = x[act]
            with np.errstate(all="ignore"):
                f = o * (np.asarray(self.phi(xa), float) - a[act])
                df = o * np.asarray(self.dphi(xa), float)
                neg = f < 0
                lo[act[neg]] = xa[neg]
                hi[act[f > 0]] = xa[f > 0]
                xn = xa - f / df
            la, ha = lo[act], hi[act]
            bad = ~((xn > la) & (xn < ha))
            xn[bad] = 0.5 * (la[bad] + ha[bad])
            tol = 4e-16 * np.abs(xa) + 1e-300
            done = (f == 0) | (np.abs(xn - xa) <= tol) | (ha - la <= tol)
            x[act] = np.where(f == 0, xa, xn)
            act = act[~done]
            if not act.size:
                break
        return x

    def bounds(self, a, own=None, lo=None, hi=None):
        """(LO, HI), shape a.shape + (P,): A(a) within piece p is [LO_p, HI_p] (empty: LO == HI).
        `own` (same shape): points with phi(own) = a, used as the exact root in their piece.
        `lo`, `hi` (scalars or arrays like a): only pieces meeting (lo, hi) are resolved, the others
        are returned empty (for measures that are negligible outside the window)."""
        a = np.asarray(a, float)
        shape = a.shape
        a = a.ravel()
        LO, HI = np.empty((a.size, self.P)), np.empty((a.size, self.P))
        if own is not None:
            own = np.asarray(own, float).ravel()
            op = np.clip(np.searchsorted(self.r, own), 0, self.P - 1)
        win = lo is not None
        if win:
            lo = np.broadcast_to(np.asarray(lo, float), shape).ravel()
            hi = np.broadcast_to(np.asarray(hi, float), shape).ravel()
        for p in range(self.P):
            l, r, yl, yr = self.l[p], self.r[p], self.yl[p], self.yr[p]
            if win:
                use = (hi > l) & (lo < r)
                if not use.any():
                    LO[:, p] = HI[:, p] = l
                    continue
            if yr > yl:
                mid = (a > yl) & (a < yr)
                x = np.where(a >= yr, r, l)
            elif yr < yl:
                mid = (a > yr) & (a < yl)
                x = np.where(a >= yl, l, r)
            else:
                LO[:, p], HI[:, p] = l, np.where(a >= yl, r, l)
                if win:
                    HI[~use, p] = l
                continue
            if win:
                mid &= use
            if mid.any():
                idx = np.nonzero(mid)[0]
                if own is not None:
                    mine = op[idx] == p
                    x[idx[mine]] = own[idx[mine]]
                    idx = idx[~mine]
                if idx.size:
                    x[idx] = self.invert(p, a[idx])
            if yr > yl:
                LO[:, p], HI[:, p] = l, x
            else:
                LO[:, p], HI[:, p] = x, r
            if win:
                LO[~use, p] = HI[~use, p] = l
        return LO.reshape(shape + (self.P,)), HI.reshape(shape + (self.P,))

    def roots(self, LO, HI):
        """The boundaries that are roots (not piece ends), others replaced by nan (band points)."""
        ends = (LO == self.l) | (LO == self.r)
        LO = np.where(ends, np.nan, LO)
        ends = (HI == self.l) | (HI == self.r)
        return LO, np.where(ends, np.nan, HI)

    # -- special points
    def _special(self):
        """Turning points and kinks (plain breakpoints) and preimages of critical values (singular)."""
        X = self.X
        plain = np.unique(np.concatenate([self.turn, self.kinks]))
        crit = [float(v) for v in np.asarray(self.phi(plain), float)] if plain.size else []
        # a long monotone tail converging to a finite limit: the limit is critical (gelu, silu: F has
        # a power singularity at the preimage of 0); tails that grow (x^2 - x) have none
        mid = np.asarray(self.phi(np.array([-X / 2, X / 2])), float)
        rng = float(np.ptp(np.asarray(self.phi(np.linspace(-X / 2, X / 2, 257)), float))) + 1e-300
        if (not self.turn.size or self.turn[0] > -X / 2) and abs(self.yl[0] - mid[0]) <= 0.01 * rng:
            crit.append(float(self.yl[0]))
        if (not self.turn.size or self.turn[-1] < X / 2) and abs(self.yr[-1] - mid[1]) <= 0.01 * rng:
            crit.append(float(self.yr[-1]))
        pts = []
        for y in set(crit):
            LO, HI = self.bounds(np.array([y]))
            pts += [v for v in np.concatenate([LO[0], HI[0]]) if -X < v < X]
        pts = np.unique(np.asarray(pts, float))
        tol = 1e-7 * (1 + np.abs(pts))
        if plain.size:
            near = np.min(np.abs(pts[:, None] - plain[None, :]), axis=1) <= tol
            pts = pts[~near]
        keep = np.ones(pts.size, bool)
        keep[1:] = np.diff(pts) > 1e-9 * (1 + np.abs(pts[1:]))
        self.plain, self.sing = plain, pts[keep]

    def clip(self, B, s):
        """Boundaries in standard units (B/s); beyond +-L_DOM mapped to +-inf."""
        z = B / s
        return np.where(z > L_DOM, np.inf, np.where(z < -L_DOM, -np.inf, z))

    def measure(self, LO, HI, s):
        """F = sum over pieces of N(HI/s) - N(LO/s)."""
        return _ndiff(LO / s, HI / s).sum(axis=-1)


_LEVELS: dict = caches.memo()


def levels(key, phi, dphi, kinks, s):
    """Cached Levels for a domain covering L_DOM standard deviations s (bucketed to powers of 2)."""
    X = 2.0 ** math.ceil(math.log2(max(L_DOM * s, 1e-6)))
    k = (key, X)
    if k not in _LEVELS:
        if len(_LEVELS) > 64:
            _LEVELS.clear()
        _LEVELS[k] = Levels(phi, dphi, kinks, X)
    return _LEVELS[k]


# ---------------------------------------------------------------- active boundaries, H
def _active(LO, HI):
    """Boundaries of the merged union of per-piece intervals: (B (n, 2P), sign (2P,), mask (n, 2P)).
    Touching intervals (a turning point inside the set) and empty ones cancel and are dropped."""
    n, P = LO.shape
    ne = HI > LO
    lo_ok = ne & (LO > -np.inf)
    hi_ok = ne.copy()
    if P > 1:
        touch = ne[:, 1:] & ne[:, :-1] & (LO[:, 1:] == HI[:, :-1])
        lo_ok[:, 1:] &= ~touch
        hi_ok[:, :-1] &= ~touch
    hi_ok &= ~(LO == np.inf)
    B = np.empty((n, 2 * P))
    B[:, 0::2], B[:, 1::2] = LO, HI
    M = np.empty((n, 2 * P), bool)
    M[:, 0::2], M[:, 1::2] = lo_ok, hi_ok
    sign = np.tile([-1.0, 1.0], P)
    return B, sign, M


def _bvn_inf(x, y, c):
    """bvn_cdf with +inf arguments allowed."""
    from scipy.special import ndtr
    out = np.empty(x.shape)
    xi, yi = np.isinf(x), np.isinf(y)
    both = xi & yi
    out[both] = 1.0
    m = xi & ~yi
    out[m] = ndtr(y[m])
    m = yi & ~xi
    out[m] = ndtr(x[m])
    m = ~(xi | yi)
    if m.any():
        out[m] = bvn_cdf(x[m], y[m], c)
    return out


def h_sum(Ba, sa, Ma, Bb, sb, Mb, c):
    """H = sum_{i,j} s_i s_j F(a_i, b_j; c) over active boundary pairs (rows of Ba, Bb aligned)."""
    n = Ba.shape[0]
    out = np.zeros(n)
    step = max(1, 400_000 // max(1, Ba.shape[1] * Bb.shape[1]))
    for i0 in range(0, n, step):
        sl = slice(i0, i0 + step)
        nn, i, j = np.nonzero(Ma[sl, :, None] & Mb[sl, None, :])
        F = _bvn_inf(Ba[sl][nn, i], Bb[sl][nn, j], c)
        out[i0:i0 + step] = np.bincount(nn, weights=sa[i] * sb[j] * F, minlength=min(step, n - i0))
    return out


def _cond_prob(LO, HI, mean, sd):
    """P(w in union of [LO_p, HI_p]) for w ~ N(mean, sd^2) (rows aligned; LO, HI (n, P)); intervals
    beyond mean +- 9.5 sd (mass < 1e-20) are skipped."""
    m = mean[:, None]
    n, i = np.nonzero((HI > LO) & (HI > m - 9.5 * sd) & (LO < m + 9.5 * sd))
    with np.errstate(invalid="ignore"):
        d = _ndiff((LO[n, i] - mean[n]) / sd, (HI[n, i] - mean[n]) / sd)
    return np.bincount(n, weights=d, minlength=LO.shape[0])


# ---------------------------------------------------------------- 1-D maps (float64)
def _act_spacing(phi, dphi, kinks):
    """Activation grid spacing h: the largest of 1, 1/2, 1/4, 1/8 for which 8- and 16-point Gauss-Legendre
    agree to 1e-12 (relative to max|f| h) on every panel [x0, x0 + h] of [-8, 8] free of kinks, for f = phi, phi'
    (tanh: 1, sigmoid(5x): 1/2)."""
    T8, W8 = np.polynomial.legendre.leggauss(8)
    T16, W16 = np.polynomial.legendre.leggauss(16)
    kk = np.asarray(kinks, float)
    for h in H_ACT:
        x0 = np.arange(-8, 8, h)
        if kk.size:
            x0 = x0[~np.any((kk[None, :] > x0[:, None]) & (kk[None, :] < x0[:, None] + h), axis=1)]
        x0 = x0[:, None]
        worst = 0.0
        for f in (phi, dphi):
            with np.errstate(all="ignore"):
                y8, y16 = np.asarray(f(x0 + h / 2 * (1 + T8)), float), np.asarray(f(x0 + h / 2 * (1 + T16)), float)
            sc = np.nanmax(np.abs(y16)) * h + 1e-300
            worst = max(worst, np.nanmax(np.abs((y8 * W8).sum(1) - (y16 * W16).sum(1))) * h / 2 / sc)
        if worst <= 1e-12:
            return h
    return H_ACT[-1]


def _grid_edges(s, h, mean=0.0, L=L_INT):
    """Unit standard grid, plus the activation grid (spacing h) when it is finer than one sd (standard units)."""
    e = list(np.arange(-L, L + 0.5))
    if s > h:
        lo, hi = max(mean - L * s, -R_ACT), min(mean + L * s, R_ACT)
        if lo < hi:
            e += [(x - mean) / s for x in np.arange(math.ceil(lo / h), math.floor(hi / h) + 1) * h]
    return e


def _inside(pts, L=L_INT):
    pts = np.asarray(pts, float)
    return pts[(pts > -L) & (pts < L)]


def argmax_expect1(f, q, k, lv):
    """E[f(u_A)] = k E[f(u) F_q(phi(u))^(k-1)], u ~ N(0, q) (float64)."""
    s = math.sqrt(float(q))
    sing = _inside(lv.sing / s)
    E = np.concatenate([_grid_edges(s, lv.h), _inside(lv.plain / s), sing])[None, :]
    saved = RES["gl"]
    if saved[0].size < 12:                 # 1-D: 12 points per panel (cheap)
        RES["gl"] = _GL12
    try:
        _, z, w = rows_rule(E, sing[None, :])
    finally:
        RES["gl"] = saved
    u = s * z
    a = np.asarray(lv.phi(u), float)
    LO, HI = lv.bounds(a, own=u)
    F = lv.measure(LO, HI, s)
    val = np.asarray(f(u), float) * F ** (k - 1)
    return float(k * np.sum(w * np.exp(-0.5 * z * z) * val) / _SQ2PI)


# ---------------------------------------------------------------- 2-D maps (float64)
def _geometry(q1, q2, q12):
    q1, q2, q12 = float(q1), float(q2), float(q12)
    s1, s2 = math.sqrt(q1), math.sqrt(q2)
    r2 = float((Fraction(q1) * Fraction(q2) - Fraction(q12) ** 2) / (Fraction(q1) * Fraction(q2)))
    r = math.sqrt(max(r2, 0.0))
    return s1, s2, q12 / (s1 * s2), r


def argmax_expect2(f, g, q1, q2, q12, k, lv, argmax_only=False):
    """E[f(u_A) g(v_B)] (argmax_only: the A = B term, = dC for f = g = phi').  float64."""
    s1, s2, c, r = _geometry(q1, q2, q12)
    if c == 0:
        a, b = argmax_expect1(f, s1 * s1, k, lv), argmax_expect1(g, s2 * s2, k, lv)
        return a * b / k if argmax_only else a * b
    if r < 1e-150 and c > 0 and s1 == s2:      # v = u: A = B, H(a, a) = F(a)
        return argmax_expect1(lambda x: np.asarray(f(x), float) * np.asarray(g(x), float), s1 * s1, k, lv)
    if r < 1e-150 or abs(c) >= 1:             # |c| = 1 (q12 = +-sqrt(q1 q2), up to its rounding)
        if argmax_only:
            return _argmax_edge(f, g, s1, s2, c, k, lv)
        c = math.copysign(1 - C_EDGE, c)
        r = math.sqrt((1 - abs(c)) * (1 + abs(c)))
    val = k * _term1(f, g, s1, s2, c, r, k, lv)
    if not argmax_only:
        val += k * (k - 1) * _term2(f, g, s1, s2, c, r, k, lv)
    return val


NARROW = 0.7                 # transitions narrower than NARROW standard units of the grid get their own grid


def _mapped_grid(pts, scale, cp, s1, J=BAND):
    """Outer points (pts + j scale)/cp in units of s1 (smoothed features of the inner integral)."""
    pts = np.asarray(pts, float)
    pts = pts[np.isfinite(pts)]
    if not pts.size:
        return np.empty(0)
    return _inside(((pts[:, None] + J[None, :] * scale) / cp / s1).ravel())


def _merge(hard, soft, tol):
    """Sorted edges: all hard points, and the soft points farther than tol from every kept point."""
    hard = np.unique(np.asarray(hard, float))
    soft = np.unique(np.asarray(soft, float))
    if hard.size and soft.size:
        j = np.clip(np.searchsorted(hard, soft), 1, hard.size) - 1
        dist = np.minimum(np.abs(soft - hard[j]), np.abs(soft - hard[np.minimum(j + 1, hard.size - 1)]))
        soft = soft[dist > tol]
    keep, last = [], -np.inf
    for x in soft:                      # greedy thinning of the soft points
        if x - last > tol:
            keep.append(x)
            last = x
    return np.union1d(hard, np.asarray(keep, float))


SCAN_Z = 1 / 16              # scan step (standard units of u) of the boundary crossings, see _crossing_grid
CROSS_R = 0.1                # r = sqrt(1 - c^2) below which the outer rule gets these points and is adaptive


def _boundaries(lv, x, s):
    """Active boundaries of A(phi(x)) in standard units x/s: (B (n, 2P), mask (n, 2P), own (n, 2P))."""
    LO, HI = lv.bounds(np.asarray(lv.phi(x), float), own=x, lo=-L_DOM * s, hi=L_DOM * s)
    B, _, M = _active(lv.clip(LO, s), lv.clip(HI, s))
    M &= np.isfinite(B)
    return B, M, B == (x / s)[:, None]


def _crossing_gap(lv, u, s1, s2, c):
    """D[n, i, j] = alpha_i/s1 - c beta_j/s2 for the boundaries alpha_i of A(phi(u)), beta_j of A(phi(c'u))
    (nan where a boundary is inactive or both are the node's own)."""
    Ba, Ma, Oa = _boundaries(lv, u, s1)
    Bb, Mb, Ob = _boundaries(lv, c * s2 / s1 * u, s2)
    with np.errstate(invalid="ignore"):
        D = Ba[:, :, None] - c * Bb[:, None, :]
    ok = Ma[:, :, None] & Mb[:, None, :] & ~(Oa[:, :, None] & Ob[:, None, :])
    return np.where(ok, D, np.nan)


def _crossing_grid(lv, s1, s2, c, r):
    """Outer points (units of s1) around the u where a boundary alpha_i of A(phi(u)) meets c beta_j of A(phi(v)),
    v = c'u (standard units; the node's own pair excepted).  Near |c| = 1, H (through F(alpha_i, beta_j; c))
    and P1 P2 change there on the scale r / |dD/du|: a kink of H at |c| = 1, smoothed on a width the outer
    panels need not resolve.  Crossings found on a scan of step SCAN_Z and refined by bisection, and the
    turning points and kinks of phi (where the node's own boundary meets its mirror, slope ~2): BAND points
    at that scale around each."""
    turn = _mapped_grid(lv.plain, r * s1 / 2, 1.0, s1)
    z = np.arange(-L_INT, L_INT + SCAN_Z / 2, SCAN_Z)
    D = _crossing_gap(lv, s1 * z, s1, s2, c)
    with np.errstate(invalid="ignore"):
        n, i, j = np.nonzero(D[:-1] * D[1:] <= 0)
    if not n.size:
        return turn
    a, b = z[n], z[n + 1]
    da, db = D[n, i, j], D[n + 1, i, j]
    slope = np.abs(db - da) / SCAN_Z
    for _ in range(40):
        m = 0.5 * (a + b)
        dm = _crossing_gap(lv, s1 * m, s1, s2, c)[np.arange(m.size), i, j]
        left = np.isfinite(dm) & (np.sign(dm) == np.sign(da))
        a, da = np.where(left, m, a), np.where(left, dm, da)
        b = np.where(left, b, m)
    zc = 0.5 * (a + b)
    with np.errstate(divide="ignore"):
        w = np.minimum(r / slope, 1.0 / 9)
    return np.concatenate([turn, _inside((zc[:, None] + BAND[None, :] * w[:, None]).ravel())])


def _outer_sum(fn, s1, lv, extra=(), tol=0.0, adaptive=False):
    """The outer integral over z1 = u/s1: the sum over its nodes of fn(u, w) (fn returns per-node values and
    folds the weight w it is handed in: n(z1) times the rule's weight).  Edges: the hard points (plain and
    singular points of phi, +-L_INT) and the soft ones (grids, ``extra``) farther than tol from every kept
    point; tanh-sinh on panels with a singular end; on the others Gauss-Legendre, or with ``adaptive``
    Gauss-Kronrod (7, 15) to RES["outer_tol"] (features of H narrower than the panels, near |c| = 1, are
    found by halving)."""
    sing1 = _inside(lv.sing / s1)
    hard = np.concatenate([_inside(lv.plain / s1), sing1, [-L_INT, L_INT]])
    E = _merge(hard, np.concatenate([_grid_edges(s1, lv.h), *extra]), tol)
    if not adaptive:
        _, zo, wo = rows_rule(E[None, :], sing1[None, :])
        return float(np.sum(fn(s1 * zo, wo * np.exp(-0.5 * zo * zo) / _SQ2PI)))
    a, wid, sing = (x[0] for x in _panels(E[None, :], sing1[None, :]))
    DF, DW = RES["de"]
    ts = (wid > 0) & sing
    zs, ws = (a[ts][:, None] + wid[ts][:, None] * DF).ravel(), (wid[ts][:, None] * DW).ravel()
    gk = (wid > 0) & ~sing
    return adaptive_gk(lambda z: fn(s1 * z, np.exp(-0.5 * z * z) / _SQ2PI), (a[gk], a[gk] + wid[gk]),
                       RES["outer_tol"], max_level=OUTER_LEVELS, fixed=(zs, ws))


_NCH = 20                    # Chebyshev points per panel of the row tables
_CX = np.cos(np.pi * (np.arange(_NCH) + 0.5) / _NCH)


def _cheb_int_matrix():
    """(NCH+1, NCH): values at the Chebyshev points -> Chebyshev coefficients of the antiderivative
    on [-1, 1] that vanishes at -1."""
    C = np.polynomial.chebyshev
    V = C.chebvander(_CX, _NCH - 1)
    inv = np.linalg.inv(V)
    return np.stack([C.chebint(inv[:, i], lbnd=-1) for i in range(_NCH)], axis=1)


_CINT = _cheb_int_matrix()


class RowCDF:
    """Per row, G(b) = P(u'/s1 in A, v'/s2 <= b) for the union A of the row's intervals [ALO, AHI]
    (standard units, corr c): G is the integral of n(y) P(u' in A | y), a smooth function, stored as
    a piecewise Chebyshev antiderivative (20 points per panel; panels: unit grid on [-10, 10] and, when
    the conditional sd r/|c| is below 0.7, a band grid around each alpha/c).  H(a, b) = sum over the
    boundaries b_j of A(b) of sign_j G(b_j)."""

    def __init__(self, ALO, AHI, c):
        R, P = ALO.shape
        r = math.sqrt((1 - c) * (1 + c))
        self.R = R
        cols = [np.broadcast_to(np.arange(-L_DOM, L_DOM + 0.5), (R, int(2 * L_DOM) + 1))]
        if r < NARROW * abs(c):
            fin = np.concatenate([ALO, AHI], axis=1)
            fin = np.where(np.isfinite(fin), fin, np.nan) / c
            cols.append((fin[:, :, None] + BAND[None, None, :] * (r / abs(c))).reshape(R, -1))
        E = np.concatenate(cols, axis=1)
        E = np.sort(np.clip(np.where(np.isfinite(E), E, L_DOM), -L_DOM, L_DOM), axis=1)
        a, b = E[:, :-1], E[:, 1:]
        hw = 0.5 * (b - a)
        y = (0.5 * (a + b))[:, :, None] + hw[:, :, None] * _CX[None, None, :]
        g = np.zeros(y.shape)
        ne = AHI > ALO
        for p in range(P):
            m = ne[:, p]
            if not m.any():
                continue
            lo, hi = ALO[m, p][:, None, None], AHI[m, p][:, None, None]
            cy = c * y[m]
            g[m] += _ndiff((lo - cy) / r, (hi - cy) / r)
        g *= np.exp(-0.5 * y * y) / _SQ2PI
        self.D = np.einsum("rpk,jk->rpj", g, _CINT) * hw[:, :, None]     # antiderivative coefficients
        tot = self.D.sum(axis=2)                                          # T_j(1) = 1
        self.cum = np.concatenate([np.zeros((R, 1)), np.cumsum(tot, axis=1)], axis=1)
        self.E, self.M = E, E.shape[1]
        self.off = 4 * L_DOM + 1
        self.flat = (E + self.off * np.arange(R)[:, None]).ravel()

    def __call__(self, rows, b):
        """G_row(b) for b in standard units (+-inf allowed)."""
        out = np.empty(b.shape)
        hi, lo = b >= L_DOM, b <= -L_DOM
        out[hi] = self.cum[rows[hi], -1]
        out[lo] = 0.0
        m = ~(hi | lo)
        rr, bb = rows[m], b[m]
        idx = np.searchsorted(self.flat, bb + self.off * rr, side="right") - 1
        p = np.clip(idx - rr * self.M, 0, self.M - 2)
        a0, a1 = self.E[rr, p], self.E[rr, p + 1]
        with np.errstate(all="ignore"):
            x = np.clip(np.where(a1 > a0, (2 * bb - a0 - a1) / (a1 - a0), 1.0), -1, 1)
        D = self.D[rr, p]
        b1 = np.zeros(x.shape)
        b2 = np.zeros(x.shape)
        for j in range(D.shape[1] - 1, 0, -1):          # Clenshaw
            b1, b2 = D[:, j] + 2 * x * b1 - b2, b1
        out[m] = self.cum[rr, p] + D[:, 0] + x * b1 - b2
        return out


def _h_at(lv, u, rows, v, s1, s2, c, sel):
    """H(phi(u_row), phi(v)) at the selected nodes: one RowCDF per row, one look-up per boundary of A(phi(v))."""
    LOu, HIu = lv.bounds(np.asarray(lv.phi(u), float), own=u, lo=-L_DOM * s1, hi=L_DOM * s1)
    tab = RowCDF(lv.clip(LOu, s1), lv.clip(HIu, s1), c)
    vs = v[sel]
    LOv, HIv = lv.bounds(np.asarray(lv.phi(vs), float), own=vs, lo=-L_DOM * s2, hi=L_DOM * s2)
    Bb, sb, Mb = _active(lv.clip(LOv, s2), lv.clip(HIv, s2))
    n, j = np.nonzero(Mb)
    G = tab(rows[sel][n], Bb[n, j])
    return np.bincount(n, weights=sb[j] * G, minlength=sel.size)


def _term1(f, g, s1, s2, c, r, k, lv):
    """E[f(u) g(v) H(phi(u), phi(v))^(k-1)] over one pair."""
    cp, sc = c * s2 / s1, s2 * r
    spec = np.concatenate([lv.plain, lv.sing])
    extra = []
    if sc < NARROW * abs(cp) * s1:         # features of width s_c around v = v* (u = v*/c')
        extra.append(_mapped_grid(spec, sc, cp, s1))
        if s2 > lv.h and max(lv.h, sc) < NARROW * abs(cp) * s1:   # g's activation grid seen through c'
            span = min(R_ACT, L_INT * abs(cp) * s1)
            extra.append(_inside(np.arange(-span, span + 1e-9, max(lv.h, sc)) / cp / s1))
    if r < CROSS_R:
        extra.append(_crossing_grid(lv, s1, s2, c, r))
    return _outer_sum(lambda u, wo: _term1_rows(f, g, u, wo, s1, s2, c, r, k, lv), s1, lv, extra,
                      tol=0.3 * min(1.0, sc / abs(cp) / s1), adaptive=r < CROSS_R)


def _term1_rows(f, g, u, wo, s1, s2, c, r, k, lv):
    """Per outer node u (outer weight wo): wo times the inner integral of term 1 over z = (v - c'u)/s_c."""
    cp, sc = c * s2 / s1, s2 * r
    spec = np.concatenate([lv.plain, lv.sing])
    R = u.size
    cols = [np.broadcast_to(np.arange(-L_INT, L_INT + 0.5), (R, int(2 * L_INT) + 1))]
    if spec.size:
        cols.append((spec[None, :] - cp * u[:, None]) / sc)
    Sin = (lv.sing[None, :] - cp * u[:, None]) / sc if lv.sing.size else np.empty((R, 0))
    if sc > lv.h:
        lo = np.maximum(cp * u - L_INT * sc, -R_ACT)
        hi = np.minimum(cp * u + L_INT * sc, R_ACT)
        k0 = np.ceil(lo / lv.h)
        K = int(max(0.0, (np.floor(hi / lv.h) - k0).max() + 1))
        if K:
            cols.append(((k0[:, None] + np.arange(K)[None, :]) * lv.h - cp * u[:, None]) / sc)
    Ein = np.clip(np.concatenate(cols, axis=1), -L_INT, L_INT)
    rows, z, w = rows_rule(Ein, Sin)
    w = w * np.exp(-0.5 * z * z) / _SQ2PI * wo[rows]
    v = cp * u[rows] + sc * z
    val = w * np.asarray(f(u), float)[rows] * np.asarray(g(v), float)
    if k > 1:
        sel = _prune(val)
        val = val[sel] * _h_at(lv, u, rows, v, s1, s2, c, sel) ** (k - 1)
        rows = rows[sel]
    return np.bincount(rows, weights=val, minlength=R)


def _prune(val, rel=1e-17):
    """Indices of the entries that matter: |val| > rel * max |val| (the rest sum to < N rel max|val|)."""
    m = np.max(np.abs(val)) if val.size else 0.0
    return np.nonzero(np.abs(val) > rel * m)[0]


def _superlevel_hull(lv, lo, hi):
    """Hull of {x : phi(x) >= min of phi over [lo, hi]} (per entry; the support of P1)."""
    ymin = np.minimum(np.asarray(lv.phi(lo), float), np.asarray(lv.phi(hi), float))
    for t in lv.plain:
        inside = (t > lo) & (t < hi)
        if inside.any():
            ymin = np.where(inside, np.minimum(ymin, float(lv.phi(np.array([t]))[0])), ymin)
    ymin = ymin - 1e-12 * (1 + np.abs(ymin))
    LO, HI = lv.bounds(ymin)            # {phi <= ymin'}: its complement holds the support
    first = np.full(ymin.shape, np.inf)
    last = np.full(ymin.shape, -np.inf)
    for p in range(lv.P):
        l, r = lv.l[p], lv.r[p]
        inc = lv.yr[p] >= lv.yl[p]
        # smallest / largest point of piece p outside the sublevel set
        if inc:
            out = HI[:, p] < r
            first = np.where(out, np.minimum(first, HI[:, p]), first)
            last = np.where(out, np.maximum(last, r), last)
        else:
            out = LO[:, p] > l
            first = np.where(out, np.minimum(first, l), first)
            last = np.where(out, np.maximum(last, LO[:, p]), last)
    first = np.where(first <= -lv.X, -np.inf, first)
    last = np.where(last >= lv.X, np.inf, last)
    return first, last


def _term2(f, g, s1, s2, c, r, k, lv):
    """E[f(u) g(v) H^(k-2) P1(u, phi(v)) P2(v, phi(u))], u ~ N(0, q1), v ~ N(0, q2) independent."""
    cp, sc = c * s2 / s1, s2 * r           # v' | u' = u ~ N(c' u, s_c^2)
    cpp, sc2 = c * s1 / s2, s1 * r         # u' | v' = v ~ N(c'' v, s_c2^2)
    spec = np.concatenate([lv.plain, lv.sing])
    bands1, bands2 = sc < NARROW * s2, sc2 < NARROW * abs(cpp) * s2
    extra = []
    if bands1 and spec.size:               # P1's bands cross v's special points: c'u + j s_c in the A-boundaries of phi(v*)
        LO, HI = lv.roots(*lv.bounds(np.asarray(lv.phi(spec), float)))
        extra.append(_mapped_grid(np.concatenate([LO.ravel(), HI.ravel(), spec]), -sc, cp, s1))
    if bands2 and spec.size:               # P2's bands: u in the A-boundaries of phi(c'' v* - j s_c2)
        y = (cpp * spec[:, None] - BAND[None, :] * sc2).ravel()
        LO, HI = lv.roots(*lv.bounds(np.asarray(lv.phi(y), float), own=y))
        w_ = np.concatenate([LO.ravel(), HI.ravel()])
        extra.append(_inside(w_[np.isfinite(w_)] / s1))
    if r < CROSS_R:
        extra.append(_crossing_grid(lv, s1, s2, c, r))
    return _outer_sum(lambda u, wo: _term2_rows(f, g, u, wo, s1, s2, c, r, k, lv), s1, lv, extra,
                      tol=0.3 * min(1.0, sc / abs(cp) / s1, sc2 / s1), adaptive=r < CROSS_R)


def _term2_rows(f, g, u, wo, s1, s2, c, r, k, lv):
    """Per outer node u (outer weight wo): wo times the inner integral of term 2 over t = v/s2."""
    cp, sc = c * s2 / s1, s2 * r
    cpp, sc2 = c * s1 / s2, s1 * r
    bands1, bands2 = sc < NARROW * s2, sc2 < NARROW * abs(cpp) * s2
    R = u.size
    a = np.asarray(lv.phi(u), float)
    LOu, HIu = lv.bounds(a, own=u, lo=-L_DOM * s1, hi=L_DOM * s1)
    # inner rows: t = v/s2, restricted to the hull of the support of P2 (c''v within 9.5 s_c2 of the
    # hull of A(phi(u))) and of P1 (phi(v) >= the minimum of phi over c'u +- 9.5 s_c)
    ne = HIu > LOu
    hlo = np.min(np.where(ne, LOu, np.inf), axis=1)
    hhi = np.max(np.where(ne, HIu, -np.inf), axis=1)
    ends = np.sort(np.stack([(hlo - 9.5 * sc2) / cpp, (hhi + 9.5 * sc2) / cpp]), axis=0)
    plo, phi_ = _superlevel_hull(lv, cp * u - 9.5 * sc, cp * u + 9.5 * sc)
    tlo = np.maximum(np.maximum(ends[0], plo) / s2, -L_INT)[:, None]
    thi = np.minimum(np.minimum(ends[1], phi_) / s2, L_INT)[:, None]
    thi = np.maximum(thi, tlo)
    base = np.concatenate([_grid_edges(s2, lv.h), _inside(lv.plain / s2), _inside(lv.sing / s2)])
    cols = [np.broadcast_to(base, (R, base.size)), tlo, thi]
    if bands1:
        y = cp * u[:, None] + BAND[None, :] * sc
        LO, HI = lv.roots(*lv.bounds(np.asarray(lv.phi(y), float), own=y, lo=-L_DOM * s2, hi=L_DOM * s2))
        cols += [LO.reshape(R, -1) / s2, HI.reshape(R, -1) / s2]
        r1 = np.concatenate(lv.roots(*lv.bounds(np.asarray(lv.phi(cp * u), float), own=cp * u)), axis=1)
    if bands2:
        r2 = np.concatenate(lv.roots(LOu, HIu), axis=1) / cpp
        if bands1:                          # a P2 band on top of a P1 band (c -> 1): the P1 band serves both
            near = np.nanmin(np.abs(r2[:, :, None] - r1[:, None, :]), axis=2, initial=np.inf) < 0.5 * sc
            r2 = np.where(near, np.nan, r2)
        cols.append(((r2[:, :, None] + BAND[None, None, :] * sc2 / abs(cpp)) / s2).reshape(R, -1))
    Ein = np.concatenate(cols, axis=1)
    Ein = np.clip(np.where(np.isfinite(Ein), Ein, thi), tlo, thi)
    sin2 = _inside(lv.sing / s2)
    rows, t, w = rows_rule(Ein, np.broadcast_to(sin2, (R, sin2.size)))
    v = s2 * t
    val = w * np.exp(-0.5 * t * t) / _SQ2PI * wo[rows] * np.asarray(f(u), float)[rows] * np.asarray(g(v), float)
    val *= _cond_prob(LOu[rows], HIu[rows], cpp * v, sc2)
    sel = _prune(val)
    rows, v, val = rows[sel], v[sel], val[sel]
    m = cp * u[rows]
    LOv, HIv = lv.bounds(np.asarray(lv.phi(v), float), own=v, lo=m - 9.5 * sc, hi=m + 9.5 * sc)
    val *= _cond_prob(LOv, HIv, m, sc)
    if k > 2:
        sel = _prune(val)
        val = val[sel] * _h_at(lv, u, rows, v, s1, s2, c, sel) ** (k - 2)
        rows = rows[sel]
    return np.bincount(rows, weights=val, minlength=R)


def _argmax_edge(f, g, s1, s2, c, k, lv):
    """|c| = 1: v = c' u; the A = B term k E[f(u) g(c'u) H(phi(u), phi(c'u))^(k-1)] by adaptive
    Gauss-Kronrod (H has kinks where boundaries of A(phi(u)) and A(phi(c'u))/c' cross)."""
    cp = c * s2 / s1

    def integrand(z):
        u = s1 * z
        v = cp * u
        val = np.asarray(f(u), float) * np.asarray(g(v), float) * np.exp(-0.5 * z * z) / _SQ2PI
        if k > 1:
            LOu, HIu = lv.bounds(np.asarray(lv.phi(u), float), own=u)
            LOv, HIv = lv.bounds(np.asarray(lv.phi(v), float), own=v)
            Ba, sa, Ma = _active(lv.clip(LOu, s1), lv.clip(HIu, s1))
            Bb, sb, Mb = _active(lv.clip(LOv, s2), lv.clip(HIv, s2))
            val = val * h_sum(Ba, sa, Ma, Bb, sb, Mb, 1.0 if c > 0 else -1.0) ** (k - 1)
        return val
    spec = np.concatenate([lv.plain, lv.sing])
    E = np.unique(np.concatenate([_grid_edges(s1, lv.h), _inside(spec / s1), _inside(spec / cp / s1)]))
    return k * adaptive_gk(integrand, E, 1e-14)


_XK = np.array([0.991455371120813, 0.949107912342759, 0.864864423359769, 0.741531185599394,
                0.586087235467691, 0.405845151377397, 0.207784955007898, 0.0])
_WK = np.array([0.022935322010529, 0.063092092629979, 0.104790010322250, 0.140653259715525,
                0.169004726639267, 0.190350578064785, 0.204432940075298, 0.209482141084728])
_WG = np.array([0.129484966168870, 0.279705391489277, 0.381830050505119, 0.417959183673469])


def adaptive_gk(fun, edges, tol, max_level=60, fixed=None):
    """Vectorised adaptive Gauss-Kronrod (7, 15) on the panels between `edges` (or on the panels (a, b)
    when `edges` is a pair of arrays): panels whose |K15 - G7| exceeds tol * S are halved, level by level,
    S = the sum of |K15| over the first level's panels (and of |w f| over `fixed`).  `fixed` = (x, w):
    nodes of another rule, evaluated with the first level and added.  QuadratureError when panels are
    still unresolved after max_level halvings."""
    xk = np.concatenate([-_XK[:-1], _XK[::-1]])
    wk = np.concatenate([_WK[:-1], _WK[::-1]])
    wg = np.zeros(15)
    wg[1::2] = np.concatenate([_WG[:-1], _WG[::-1]])
    if isinstance(edges, tuple):
        a, b = (np.asarray(e, float) for e in edges)
    else:
        a, b = np.asarray(edges[:-1], float), np.asarray(edges[1:], float)
    xf, wf = (np.asarray(e, float) for e in fixed) if fixed is not None else (np.empty(0), np.empty(0))
    total, scale = 0.0, None
    for _ in range(max_level):
        hw = 0.5 * (b - a)
        x = (0.5 * (a + b))[:, None] + hw[:, None] * xk[None, :]
        fx = np.asarray(fun(np.concatenate([x.ravel(), xf])), float)
        K = hw * (fx[:x.size].reshape(x.shape) @ wk)
        G = hw * (fx[:x.size].reshape(x.shape) @ wg)
        if scale is None:
            fw = wf * fx[x.size:]
            total, scale = float(np.sum(fw)), max(np.sum(np.abs(K)) + np.sum(np.abs(fw)), 1e-300)
            xf = np.empty(0)
        bad = np.abs(K - G) > tol * scale
        total += np.sum(K[~bad])
        if not bad.any():
            return total
        m = 0.5 * (a[bad] + b[bad])
        a, b = np.concatenate([a[bad], m]), np.concatenate([m, b[bad]])
    raise QuadratureError(f"adaptive Gauss-Kronrod: {a.size} panels near {np.unique(np.round(a, 6))[:4]} "
                          f"unresolved after {max_level} halvings (error estimate above {tol:g} of the scale)")


# ---------------------------------------------------------------- mpmath, 1-D maps
class LevelsMP:
    """mpmath refinement of a float64 Levels: turning points, piece ends and roots to working precision."""

    def __init__(self, lv, phi, dphi, L_s):
        self.lv, self.phi, self.dphi = lv, phi, dphi
        kinks = set(float(x) for x in lv.kinks)
        turn = [mpmath.mpf(t) if float(t) in kinks else self._refine_turn(t) for t in lv.turn]
        self.ends = [-L_s] + [t for t in turn if -L_s < t < L_s] + [L_s]
        self.pid = [i for i, t in enumerate(lv.turn) if -L_s < turn[i] < L_s]
        self.yend = [phi(x) for x in self.ends]

    def _refine_turn(self, t):
        x = mpmath.mpf(t)
        try:
            return mpmath.findroot(self.dphi, x, tol=mpmath.mpf(10) ** (-2 * mpmath.mp.dps))
        except (ValueError, ZeroDivisionError):
            return x

    def root(self, l, r, a, guess):
        """x in [l, r] with phi(x) = a: Newton from the float64 root, bisection if that fails."""
        f, df = self.phi, self.dphi
        x = mpmath.mpf(guess) if l < guess < r else (l + r) / 2
        eps = mpmath.mpf(2) ** (-mpmath.mp.prec + 4)
        for _ in range(12):
            d = df(x)
            if d == 0:
                break
            xn = x - (f(x) - a) / d
            if not l <= xn <= r:
                break
            if abs(xn - x) <= eps * (1 + abs(x)):
                return xn
            x = xn
        inc = f(r) > f(l)
        lo, hi = l, r
        for _ in range(mpmath.mp.prec + 10):
            m = (lo + hi) / 2
            if (f(m) < a) == inc:
                lo = m
            else:
                hi = m
        return (lo + hi) / 2

    def measure(self, a, own, s):
        """F(a) = P(s z in A(a)) with own the node (its piece's root)."""
        return mpmath.fsum(sg * mpmath.ncdf(x / s) for x, sg in self.bounds(a, own))

    def bounds(self, a, own):
        """Boundaries of A(a) as (x, sign): F(A(a)) = sum sign G(x) for any CDF G; lower ends at -inf dropped,
        upper ends at +inf kept; a boundary shared by touching intervals cancels and is dropped."""
        out = []
        n = len(self.ends) - 1
        for p in range(n):
            l, r, yl, yr = self.ends[p], self.ends[p + 1], self.yend[p], self.yend[p + 1]
            if yr > yl:
                lo = l
                if a >= yr:
                    hi = r
                elif a <= yl:
                    continue
                else:
                    hi = own if l <= own <= r else self.root(l, r, a, self._guess(p, a))
            elif yr < yl:
                hi = r
                if a >= yl:
                    lo = l
                elif a <= yr:
                    continue
                else:
                    lo = own if l <= own <= r else self.root(l, r, a, self._guess(p, a))
            else:
                if a < yl:
                    continue
                lo, hi = l, r
            hi = mpmath.inf if p == n - 1 and hi == r else hi
            if out and out[-1][1] == 1 and out[-1][0] == lo:
                out.pop()                    # [., lo] and [lo, hi] touch: one interval
            elif not (p == 0 and lo == l):
                out.append((lo, -1))
            out.append((hi, 1))
        return out

    def _guess(self, p, a):
        lv = self.lv
        x = float(self.ends[p] + self.ends[p + 1]) / 2
        j = int(np.clip(np.searchsorted(lv.r, x), 0, lv.P - 1))
        lo, hi = sorted((float(lv.yl[j]), float(lv.yr[j])))
        if lo < float(a) < hi:
            return float(lv.invert(j, np.array([float(a)]))[0])
        return x


def argmax_expect1_mp(f, phi, dphi, q, k, lv, dps, scale=0):
    """E[f(u_A)] at dps digits (mpmath): panels as in the float64 rule, tanh-sinh on each; error <= 10^-dps
    max(|value|, scale) (scale: a natural scale such as sqrt(E f(u_A)^2) when the value may vanish)."""
    q = mpmath.mpf(q)
    if q == 0:                   # every node is 0: u_A = 0
        return f(q)
    s = mpmath.sqrt(q)
    L = mpmath.sqrt(2 * (dps + 6) * mpmath.log(10)) + 1
    mlv = LevelsMP(lv, phi, dphi, L * s)
    pts = set(mpmath.mpf(j) for j in range(-int(L), int(L) + 1)) | {-L, L}
    for x in list(mlv.ends[1:-1]) + [mpmath.mpf(x) for x in lv.kinks]:
        if -L < x / s < L:
            pts.add(x / s)
    for x in lv.sing:            # singular points to working precision: roots of phi = critical value
        y = _nearest_crit(mlv, phi, lv, float(x))
        xm = mpmath.mpf(x)
        if y is not None:
            try:
                xm = mpmath.findroot(lambda t: phi(t) - y, xm, tol=mpmath.mpf(10) ** (-2 * mpmath.mp.dps))
            except (ValueError, ZeroDivisionError):
                pass
        if -L < xm / s < L:
            pts.add(xm / s)
    if s > lv.h:
        for j in range(math.ceil(-R_ACT / lv.h), math.floor(R_ACT / lv.h) + 1):
            x = j * mpmath.mpf(lv.h) / s
            if -L < x < L:
                pts.add(x)
    pts = sorted(pts)

    def integrand(z):
        u = s * z
        return f(u) * mlv.measure(phi(u), u, s) ** (k - 1) * mpmath.npdf(z)
    val, err = mpmath.quad(integrand, pts, error=True, maxdegree=8)
    val = k * val
    if err * k > mpmath.mpf(10) ** (-dps) * max(abs(val), scale, mpmath.mpf(10) ** (-2 * dps)):
        raise PrecisionError(f"max-pool (non-monotone phi) 1-D map at dps={dps}: mpmath.quad error estimate "
                              f"{mpmath.nstr(err * k, 3)} exceeds 10^-{dps} of the value {mpmath.nstr(val, 8)}.")
    return val


def _nearest_crit(mlv, phi, lv, x):
    """The critical value phi takes at the singular point x (mpmath), or None."""
    cands = [phi(mpmath.mpf(t)) for t in lv.plain] + [mlv.yend[0], mlv.yend[-1]]
    fx = float(lv.phi(np.array([x]))[0])
    best = min(cands, key=lambda y: abs(float(y) - fx))
    return best if abs(float(best) - fx) <= 1e-9 * (1 + abs(fx)) else None


# ---------------------------------------------------------------- mpmath, covariance maps
@lru_cache(maxsize=32)
def _gl_nodes(d, prec):
    """Degree-d Gauss-Legendre rule of mpmath on [-1, 1] (3 2^(d-1) nodes): ((t, w), ...)."""
    with mpmath.workprec(prec):
        return tuple(mpmath.calculus.quadrature.GaussLegendre(mpmath.mp).calc_nodes(d, prec))


@lru_cache(maxsize=32)
def _ts_nodes(d, prec):
    """tanh-sinh on [-1, 1], step 2^(1-d) (error ~ exp(-pi^2 2^(d-1))), |t| <= T where the weight is < 2^-prec."""
    with mpmath.workprec(prec + 20):
        h = mpmath.mpf(2) ** (1 - d)
        out, j = [], 0
        while True:
            t = j * h
            y = mpmath.pi / 2 * mpmath.sinh(t)
            w = h * mpmath.pi / 2 * mpmath.cosh(t) / mpmath.cosh(y) ** 2
            x = mpmath.tanh(y)
            if w < mpmath.mpf(2) ** -prec or x == 1:
                break
            out += [(x, w)] if j == 0 else [(x, w), (-x, w)]
            j += 1
        return tuple(out)


def _panel_rule(breaks, sing, d):
    """(nodes, weights) of N(0, 1) (n(z) included) on the panels between sorted breaks: Gauss-Legendre of degree
    d, tanh-sinh (step 2^(1-d)) on the panels with an end in `sing` (power-type singularities there)."""
    prec = mpmath.mp.prec
    zs, ws = [], []
    for a, b in zip(breaks[:-1], breaks[1:]):
        rule = _ts_nodes(d, prec) if (a in sing or b in sing) else _gl_nodes(d, prec)
        hw, mid = (b - a) / 2, (a + b) / 2
        for t, w in rule:
            z = mid + hw * t
            zs.append(z)
            ws.append(hw * w * mpmath.npdf(z))
    return zs, ws


def _breakset(L, step, pts, tol):
    """Sorted breakpoints on [-L, L]: multiples of step, the points pts inside, the ends (merged within tol)."""
    zs = {-L, L} | {j * step for j in range(-int(L / step), int(L / step) + 1)} | {p for p in pts if -L < p < L}
    out = []
    for z in sorted(zs):
        if not out or z - out[-1] > tol:
            out.append(z)
    out[-1] = L
    return out


class _BVN:
    """F(h, k; c) = P(Z1 <= h, Z2 <= k), corr c, at mpmath precision by the theta form of Plackett's identity,
        F(h, k; c) = F(h, k; c0) + (1/2 pi) int_{asin c0}^{asin c} exp(-(h^2 - 2 h k sin t + k^2)/(2 cos^2 t)) dt,
    c0 = 0 (F = N(h) N(k)) for |c| <= 0.8, else c0 = sign(c) (F = N(min(h, k)) or max(0, N(h) + N(k) - 1)),
    Gauss-Legendre of degree d in t (entire integrand on the interval), summed in fixed point (prec + 40 bits)."""

    def __init__(self, c, d):
        self.bits = bits = mpmath.mp.prec + 40
        self.fx = lambda v: to_fixed(mpmath.mpf(v)._mpf_, bits)
        self.ln2 = ln2_fixed(bits)
        self.cut = -bits * self.ln2 - (8 << bits)
        self.c0 = 0 if abs(c) <= mpmath.mpf("0.8") else (1 if c > 0 else -1)
        a, b = mpmath.asin(self.c0), mpmath.asin(c)
        hw, mid = (b - a) / 2, (a + b) / 2
        self.nodes = []
        for t, w in _gl_nodes(d, mpmath.mp.prec):
            th = mid + hw * t
            cs = mpmath.cos(th)
            self.nodes.append((self.fx(2 * mpmath.sin(th)), self.fx(-1 / (2 * cs * cs)), self.fx(hw * w / (2 * mpmath.pi))))

    def prep(self, h):
        """(h, N(h), fixed-point h, h^2) for a boundary (h may be +inf)."""
        Nh = mpmath.ncdf(h)
        return (h, Nh, None, None) if h == mpmath.inf else (h, Nh, self.fx(h), self.fx(h * h))

    def __call__(self, H, K):
        """F(h, k; c) from prep(h), prep(k)."""
        h, Nh, hI, h2 = H
        k, Nk, kI, k2 = K
        if hI is None:
            return Nk
        if kI is None:
            return Nh
        bits, ln2, cut = self.bits, self.ln2, self.cut
        hh, hk = h2 + k2, (hI * kI) >> bits
        tot = 0
        for sI, eI, wI in self.nodes:
            x = ((hh - ((hk * sI) >> bits)) * eI) >> bits
            if x > cut:
                tot += wI * exp_fixed(x, bits, ln2)
        val = mpmath.mpf((tot, -2 * bits))
        if self.c0 == 0:
            return Nh * Nk + val
        return (min(Nh, Nk) if self.c0 > 0 else max(mpmath.mpf(0), Nh + Nk - 1)) + val


def _special_points_mp(phi, lv, m1):
    """(plain, sing): phi's special points (turning points, kinks, level-set ends) and the preimages of its
    critical values, the latter refined to working precision (roots of phi = critical value by findroot)."""
    def exact(x):
        x = mpmath.mpf(x)
        y = _nearest_crit(m1, phi, lv, float(x))
        if y is None:
            return x
        try:
            return mpmath.findroot(lambda t: phi(t) - y, x, tol=mpmath.mpf(10) ** (-2 * mpmath.mp.dps))
        except (ValueError, ZeroDivisionError):
            return x
    return [mpmath.mpf(x) for x in lv.plain] + [x for x in m1.ends[1:-1]], [exact(x) for x in lv.sing]


def _first_term(g, phi, m2, k, mu, sc, s2, zs, wz, Hu, std):
    """Terms k w_z g(v) H(phi(u), phi(v))^(k-1), v = c'u + s_c z, of one row u (Hu(B) = H with u's boundaries)."""
    acc = []
    for z, wzi in zip(zs, wz):
        v = mu + sc * z
        gv = g(v)
        if gv == 0:
            continue
        Hv = Hu(std(m2.bounds(phi(v), v), s2))
        acc.append(k * wzi * gv * (Hv ** (k - 1) if k > 1 else 1))
    return acc


def _second_term(k, mu, sc, cpp, sc2, Bu, rowT, Hu):
    """Terms k(k-1) w_t g(v) P1 P2 H^(k-2) of one row u over the shared grid rowT (u, v independent):
    P1 = sum_j s_j N((beta_j - c'u)/s_c), P2 = sum_i s_i N((alpha_i - c''v)/s_c2)."""
    acc = []
    for wg, v, Bv, Bvs in rowT:
        P1 = mpmath.fsum(sg * mpmath.ncdf((x - mu) / sc) for x, sg in Bv)
        P2 = mpmath.fsum(sg * mpmath.ncdf((x - cpp * v) / sc2) for x, sg in Bu)
        t2 = k * (k - 1) * wg * P1 * P2
        if k > 2:
            t2 *= Hu(Bvs) ** (k - 2)
        acc.append(t2)
    return acc


def argmax_expect2_mp(f, g, phi, dphi, q1, q2, q12, k, lv, N, argmax_only=False):
    """E[f(u_A) g(v_B)] (argmax_only: its A = B term, = dC for f = g = phi') at N digits (mpmath), 0 < |c| < 1.

    The float64 formula (module docstring) with every factor at working precision:
        k E[f(u) g(v) H^(k-1)] (one pair)  +  k(k-1) E[f(u) g(v) H^(k-2) P1 P2] (u, v independent),
    H(phi(u), phi(v)) = sum_{i,j} s_i s_j F(alpha_i/s1, beta_j/s2; c) over the boundaries alpha_i of A(phi(u)) and
    beta_j of A(phi(v)) (LevelsMP.bounds: mpmath roots, the node itself exact), F by _BVN;
    P1 = sum_j s_j N((beta_j - c'u)/s_c), P2 = sum_i s_i N((alpha_i - c''v)/s_c2).
    Rule: tensor product in (s = u/s1, z = (v - c'u)/s_c) (first term) and (s, t = v/s2) (second), panels of width
    min(gw, h/scale) on [-L, L] (_plan(N)) broken at phi's special points (turning points, kinks, preimages of
    critical values) and, outer, at their images v*/c'; Gauss-Legendre of degree d, tanh-sinh on panels ending at
    a preimage of a critical value (F_q(phi(u)) has a power singularity there).  Error control:
    quadrature.controlled (degrees d-2, d-1, d, also of _BVN's rule; panel halvings; ArithmeticError), scale
    S = max(|value|, min(1, E|f(u_A) g(v_B)|)) <= sqrt(V(q1) V(q2)) for C, sqrt(dpsi2 dpsi2) for dC (Cauchy-Schwarz)."""
    q1, q2, q12 = (mpmath.mpf(v) for v in (q1, q2, q12))
    s1, s2 = mpmath.sqrt(q1), mpmath.sqrt(q2)
    with mpmath.workprec(2 * mpmath.mp.prec + 20):
        r = mpmath.sqrt((q1 * q2 - q12 * q12) / (q1 * q2))
    c = q12 / (s1 * s2)
    cp, sc = c * s2 / s1, s2 * r             # v | u ~ N(c'u, s_c^2)
    cpp, sc2 = c * s1 / s2, s1 * r           # u | v ~ N(c''v, s_c2^2)
    Lm = mpmath.sqrt(2 * (N + 6) * mpmath.log(10)) + 1
    m1, m2 = LevelsMP(lv, phi, dphi, Lm * s1), LevelsMP(lv, phi, dphi, Lm * s2)
    plain, sing = _special_points_mp(phi, lv, m1)
    tol = mpmath.mpf(10) ** -(N + GUARD)

    def level(P, d, want_abs):
        L, gw, h = P[:3]

        def std(B, s):
            return [(bvn.prep(x / s), sg) for x, sg in B]
        bvn = _BVN(c, max(d - 1, 1))         # the theta rule one degree lower (smooth on a short interval)

        def H(Ba, Bb):
            return mpmath.fsum(sa * sb * bvn(a, b) for a, sa in Ba for b, sb in Bb)
        so = [x / s1 for x in plain + sing] + [x / (cp * s1) for x in plain + sing]
        sS = set(x / s1 for x in sing)
        ss, ws = _panel_rule(_breakset(L, min(gw, h / s1), so, tol), sS, d)
        if not argmax_only:                  # second term: t = v/s2 grid shared by the rows
            sT = set(x / s2 for x in sing)
            ts, wt = _panel_rule(_breakset(L, min(gw, h / s2), [x / s2 for x in plain + sing], tol), sT, d)
            vs = [s2 * t for t in ts]
            rowT = [(w * g(v), v, m2.bounds(phi(v), v)) for v, w in zip(vs, wt)]
            rowT = [(a, v, B, std(B, s2)) for a, v, B in rowT if a != 0]
        tot, tabs = [], []
        for s, w in zip(ss, ws):
            u = s1 * s
            fu = f(u)
            if fu == 0:
                continue
            Bu = m1.bounds(phi(u), u)
            Ba = std(Bu, s1)
            mu = cp * u
            zs, wz = _panel_rule(_breakset(L, min(gw, h / sc), [(x - mu) / sc for x in plain + sing], tol),
                                 set((x - mu) / sc for x in sing), d)
            acc = _first_term(g, phi, m2, k, mu, sc, s2, zs, wz, lambda B: H(Ba, B), std)
            if not argmax_only:
                acc += _second_term(k, mu, sc, cpp, sc2, Bu, rowT, lambda B: H(Ba, B))
            row = mpmath.fsum(acc)
            tot.append(w * fu * row)
            if want_abs:
                tabs.append(abs(w * fu) * mpmath.fsum(abs(x) for x in acc))
        return mpmath.fsum(tot), (mpmath.fsum(tabs) if want_abs else None)
    return controlled(level, N, "max-pool covariance (non-monotone phi, level sets)")
