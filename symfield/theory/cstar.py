"""The correlation fixed point c*: the stable root of the c-map reached from c^(1) (docs/theory.md section 5).

    f(c) = (sigma_w2 C(q*, q*, c q*) + sigma_b2)/q*,   c^(1) = sigma_b2/(sigma_w2 + sigma_b2)

located in float64 by a scan from c^(1) and refined (at dps: certified by the context's ``refine``); q* = 0 or
inf use the limit map; 1 - c* near 0 comes from the distance map without cancellation (:func:`gap_star`).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any

import mpmath
import numpy as np
from numpy.typing import ArrayLike, NDArray

from symfield.core.errors import Unsupported
from symfield.numeric.context import objects
from symfield.numeric.evaluate import to_mpf
from symfield.numeric.maps import maps
from symfield.numeric.vroot import vroot
from symfield.symbolic.activation import Activation

from symfield.core import validate as check
from symfield.symbolic.kernel import kernel
from symfield.theory import norm as nm
from symfield.theory.qstar import Q_MAX, at_infinity, at_zero, limit_q, on_grid, q_star_points


# ---------------------------------------------------------------- c*
G_TOL = 1e-13  # |f(c) - c| below this counts as a fixed point (the maps' float64 accuracy)
SCAN = 64  # grid points scanned for the first sign change of the c-map on the way from c^(1)


NEAR_END = 10.0 ** -np.arange(1, 11)  # extra scan points end - (end - c) * 1e-j next to c = +-1


def c_star_f64(K, sw, sb, qs=None):
    """float64 c* for 1-D arrays: the stable fixed point of g(c) = f(c) - c reached from
    c1 = sigma_b2/(sigma_w2 + sigma_b2), f(c) = (sigma_w2 C(q*, q*, c q*) + sigma_b2)/q*: the
    first root of g in the direction f moves c1, located by a scan (SCAN equal steps, then
    points approaching +-1 geometrically, where the root sits when chi1 is just above 1) and
    refined by vroot. q* = 0 or inf: the normalised map c' = C(q, q, c q)/V(q) in that limit
    (sigma_b2 negligible against q), exact where a limit kernel serves the row (qstar.at_infinity, at_zero)
    and for positively homogeneous psi, else at q = limit_q. Returns (c*, q*)."""
    M = maps(K)
    sw, sb = np.asarray(sw, float), np.asarray(sb, float)
    qs = q_star_points(maps(K), sw, sb) if qs is None else qs
    same = _limit_twins(K, M, sw, sb, qs)
    if same is not None:           # one scan per distinct limit problem, shared by its twins
        keep, rep = same
        c, _ = c_star_f64(K, sw[keep], sb[keep], qs[keep])
        return c[rep], qs
    finite = (qs > 0) & (qs < math.inf)
    c1 = _c1(sw, sb)
    # odd psi from c^(1) = 0 (sigma_b2 = 0) stays at c = 0 exactly, C(q, q, 0) = E[psi]^2 = 0: no descent
    descend = (qs == 0) & (sw > 0) & ~((K.parity == 1) & (c1 == 0))
    to_zero = np.nonzero(descend)[0] if _descent_cheap(K, M) else np.zeros(0, int)
    L, at_inf = at_infinity(K, qs)
    Z, at_0 = at_zero(K, qs)
    at_0[to_zero] = False       # descended rows keep the maps at small q (the next order decides there)
    at_lim = at_inf | at_0      # the exact limit kernels, at q = 1
    qe = np.where(finite, qs, np.where(at_lim, 1.0, limit_q(K, qs)))
    per_point = SCAN + NEAR_END.size    # evaluations announced to the rent-or-buy rule (1-D tables): a scan per descent
    M.plan(sw.size + to_zero.size * per_point)
    frozen = np.zeros(sw.shape, bool)
    if to_zero.size:       # start the limit map where the recursion has brought c (c freezes: c* is there)
        c1 = c1.copy()
        c1[to_zero], frozen[to_zero] = _descend(M, sw[to_zero])
    vq = np.ones(qe.shape)
    rest = ~finite & ~at_lim
    vq[rest] = M.V(qe[rest])
    for E, on in ((L, at_inf), (Z, at_0)):
        if on.any():
            vq[on] = E.V(1.0)

    def g(c, j):
        val = np.empty(j.shape)
        for E, on in ((M, ~at_lim[j]), (L, at_inf[j]), (Z, at_0[j])):
            if on.any():
                val[on] = E.C_eq(qe[j[on]], c[on])
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(finite[j], (sw[j] * val + sb[j]) / qe[j], val / vq[j]) - c

    n = sw.size
    out = np.full(n, np.nan)
    done = (sw == 0) | np.isnan(qs) | frozen
    out[done] = np.where(np.isnan(qs[done]), np.nan, c1[done])
    to_one = _ordered_to_one(M, sw, qs, finite, c1) & ~done    # before any C: c* = 1 by convexity
    out[to_one], done[to_one] = 1.0, True
    g1 = np.zeros(n)
    live = np.nonzero(~done)[0]
    if live.size:
        g1[live] = g(c1[live], live)
    fixed = ~done & (np.abs(g1) <= G_TOL)
    out[fixed], done[fixed] = c1[fixed], True
    end = np.where(g1 > 0, 1.0, -1.0)
    climb = np.nonzero(_climbing(c1, g1) & ~done)[0]
    M.plan(sw.size + (to_zero.size + int((~done).sum()) - climb.size) * per_point + climb.size * CLIMB_EVALS)
    if climb.size:     # convex g from c^(1) >= 0 up: one root below 1 or none (_climb); no scan
        j, lo_j, hi_j, glo_j, ghi_j = _climb(lambda c, k: g(c, climb[k]), c1[climb], g1[climb])
        out[climb], done[climb] = 1.0, True      # no bracket: the recursion climbs to 1
        if j.size:
            out[climb[j]] = vroot(lambda x, k: g(x, climb[j[k]]), lo_j, hi_j, glo_j, ghi_j)
    rows = np.nonzero(~done)[0]
    if rows.size:
        out[rows] = _scan(lambda c, k: g(c, rows[k]), c1[rows], g1[rows], end[rows])
    return out, qs


def _scan(g, c1, g1, end):
    """c* by the first sign change of g(c, k) (rows k of the arrays) on SCAN equal steps from c^(1) toward
    end = +-1, then points approaching it geometrically (NEAR_END; there a crossing must stand out of the
    maps' rounding, G_TOL), refined by vroot; end where g keeps its sign."""
    n = c1.size
    out, done = np.full(n, np.nan), np.zeros(n, bool)
    fracs = np.concatenate([np.arange(1, SCAN) / SCAN, 1 - NEAR_END / SCAN])
    prev_c, prev_g = c1.copy(), g1.copy()
    lo, hi, glo, ghi = (np.full(n, np.nan) for _ in range(4))
    bracketed = np.zeros(n, bool)
    for i, t in enumerate(fracs):
        idx = np.nonzero(~done & ~bracketed)[0]
        if idx.size == 0:
            break
        c = c1[idx] + (end[idx] - c1[idx]) * t
        gc = g(c, idx)
        hit = (np.abs(gc) <= G_TOL) & (i < SCAN - 1)
        out[idx[hit]] = c[hit]
        done[idx[hit]] = True
        cross = ~hit & ((gc > 0) != (prev_g[idx] > 0))
        if i >= SCAN - 1:
            cross &= np.abs(gc) > G_TOL
        j = idx[cross]
        lo[j], hi[j], glo[j], ghi[j] = prev_c[j], c[cross], prev_g[j], gc[cross]
        bracketed[j] = True
        prev_c[idx], prev_g[idx] = c, gc
    rest = ~done & ~bracketed  # no crossing before +-1: the recursion runs to the boundary
    out[rest] = end[rest]
    j = np.nonzero(bracketed)[0]
    if j.size:
        out[j] = vroot(lambda x, k: g(x, j[k]), lo[j], hi[j], glo[j], ghi[j])
    return out


CLIMB = 4.0 ** -np.arange(1, 21)     # 1 - c = (1 - c^(1)) 4^-j: the climb's probes toward c = 1
CLIMB_EVALS = 12                     # evaluations of a climbing row announced to the rent-or-buy rule (~10 measured)


def _climbing(c1, g1):
    """Rows whose c moves up from c^(1) >= 0, where g is convex (:func:`_ordered_to_one`): bracketed by :func:`_climb`."""
    return (c1 >= 0) & (g1 > G_TOL)


def _climb(g, c1, g1):
    """Bracket the one root of the convex c-map residual g on (c^(1), 1) (see :func:`_ordered_to_one`:
    g(1) = 0, g(c^(1)) > 0; a root below 1 exists iff g < 0 somewhere below 1, then it is unique). Probes
    c = 1 - (1 - c^(1)) 4^-j walk toward 1; the first with g < -G_TOL closes the bracket (near 1 a
    crossing must stand out of the maps' rounding). Returns (rows bracketed, lo, hi, g(lo), g(hi)); rows
    with no bracket by 1 - (1 - c^(1)) 4^-20 climb to c* = 1."""
    n = c1.size
    lo, glo = c1.copy(), g1.copy()
    hi, ghi = np.full(n, np.nan), np.full(n, np.nan)
    live = np.arange(n)
    for t in CLIMB:
        if live.size == 0:
            break
        c = 1.0 - (1.0 - c1[live]) * t
        gc = g(c, live)
        neg = gc < -G_TOL
        k = live[neg]
        hi[k], ghi[k] = c[neg], gc[neg]
        up = ~neg & (gc > 0)                 # still above: the root is further up
        lo[live[up]], glo[live[up]] = c[up], gc[up]
        live = live[~neg]
    j = np.nonzero(np.isfinite(hi))[0]
    return j, lo[j], hi[j], glo[j], ghi[j]


def _c1(sw, sb):
    """c^(1) = sigma_b2/(sigma_w2 + sigma_b2) (0 where both vanish)."""
    return np.where(sw + sb > 0, sb / np.where(sw + sb > 0, sw + sb, 1.0), 0.0)


def _limit_twins(K, M, sw, sb, qs):
    """Rows at q* = 0 or inf (not descended) solve the same limit c-map g(c) = C(q, q, c q)/V(q) - c at the
    same q (limit_q or the limit kernel's q = 1), whatever sigma_w2 and sigma_b2: their c* depends on
    (q*, c^(1)) only (c^(1) = sigma_b2/(sigma_w2 + sigma_b2); sigma_w2 = 0 is c^(1) itself). Returns (rows to
    solve, index of each row's representative among them), or None when every row is distinct."""
    lim = (qs == 0) | (qs == math.inf)
    if lim.sum() < 2:
        return None
    if _descent_cheap(K, M):       # q* = 0 rows descend from layer 1 (sigma_w2 matters): no twins among them
        lim &= ~((qs == 0) & (sw > 0))
    key = np.stack([np.where(lim, qs, -1.0), np.where(lim, _c1(sw, sb), np.arange(qs.size)), sw == 0], axis=1)
    uniq, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    if uniq.shape[0] == qs.size:
        return None
    keep = np.sort(first)
    pos = np.empty(qs.size, int)
    pos[keep] = np.arange(keep.size)
    return keep, pos[first[inv.ravel()]]


CHI1_MARGIN = 1e-9   # chi1 <= 1 - this: c* = 1 without a scan (c^(1) >= 0)


def _ordered_to_one(M, sw, qs, finite, c1):
    """Points whose c* is 1 by convexity, decided before any C is evaluated. At equal norms the k nodes of a
    pool see (u_i, v_i) independent across i, each pair at correlation c, so Mehler's formula factorises
    over the nodes: C(q, q, c q) = E[psi(u) psi(v)] = sum_alpha c^|alpha| q^|alpha| E[d^alpha psi]^2/alpha!
    (multi-index alpha over the k nodes; for a psi that is not smooth, such as a max of a non-monotone phi,
    the Wiener chaos expansion sum_n c^n ||J_n psi||^2), nonnegative coefficients for one node, an average
    and a max alike. So g(c) = f(c) - c is convex on [0, 1] with g(1) = 0 at a finite q*, and its slope at
    c = 1 (one-sided where C - C(1) has a (1 - c)^(3/2) term) is chi1 - 1, chi1 = sigma_w2 E[psi'^2](q*).
    Convexity puts g above its tangent at 1: g(c) >= (1 - chi1)(1 - c) > 0 on [c^(1), 1) when chi1 < 1, so
    g has no root there and the recursion climbs to 1 (0 <= c^(1) < 1; no evaluation of g needed)."""
    ok = finite & (c1 >= 0) & (c1 < 1) & (sw > 0)
    if not ok.any():
        return ok
    chi1 = np.full(sw.shape, np.inf)
    chi1[ok] = sw[ok] * M.dpsi2(qs[ok])
    return ok & (chi1 <= 1 - CHI1_MARGIN)


Q_DESCENT, MAX_DESCENT = 1e-8, 5000   # q* = 0: follow the recursion down to q = Q_DESCENT (layer cap)


def _descent_cheap(K, M):
    """The q* = 0 descent runs where C costs microseconds at every q (the engine's ``fast_C``: a closed form,
    or a table whose panels build in seconds). Homogeneous psi keep the limit map, exact at q = 1; max-pools
    and kinked integral-form phi (ELU) keep the limit map from c^(1) (their tables build in minutes)."""
    return not K.degree_one and M.fast_C


def _descend(M, sw):
    """q* = 0 (sigma_b2 = 0): run the recursion q' = sw V(q), c' = C(q, q, c q)/V(q) from layer 1
    (q = sw, c = 0) down to q <= Q_DESCENT. If there the c-map is the identity to leading order (its
    displacement C/V - c shrinks with q: psi'(0) != 0, e.g. gelu, silu, mish, elu), c stops moving as
    q -> 0 and c* is where it freezes: the recursion goes on until |dc| <= 1e-15 ("frozen"). Otherwise
    (e.g. x erf(x) ~ x^2, C/V -> (1 + 2c^2)/3) the q -> 0 limit map has genuine fixed points and c* is
    its root reached from the returned c. Returns (c, frozen)."""
    q, c = sw.astype(float).copy(), np.zeros(sw.shape)
    live = q[(q > Q_DESCENT) & (q < Q_MAX)]
    if live.size:
        M.cover(Q_DESCENT / 16, float(live.max()))
    for _ in range(MAX_DESCENT):
        i = np.nonzero((q > Q_DESCENT) & (q < Q_MAX))[0]
        if i.size == 0:
            break
        v = M.V(q[i])
        c[i], q[i] = np.clip(M.C_eq(q[i], c[i]) / v, -1.0, 1.0), sw[i] * v
    frozen = np.zeros(sw.shape, bool)
    small = np.nonzero((q <= Q_DESCENT) & (q > 0))[0]
    if small.size:
        ci = c[small]        # displacement of the limit map at two fixed small q (not at the last q,
        qi = np.full(ci.shape, Q_DESCENT)   # which can be far below where C/V keeps its relative digits)
        d1 = M.C_eq(qi, ci) / M.V(qi) - ci
        d2 = M.C_eq(qi / 16, ci) / M.V(qi / 16) - ci
        frozen[small] = np.abs(d2) <= 0.5 * np.abs(d1) + G_TOL   # drift ~ q^a, a >= 1/4
        i = np.nonzero(frozen)[0]
        for _ in range(MAX_DESCENT):
            i = i[q[i] > 1e-280]
            if i.size == 0:
                break
            v = M.V(q[i])
            cn = np.clip(M.C_eq(q[i], c[i]) / v, -1.0, 1.0)
            moved = np.abs(cn - c[i]) > 1e-15
            c[i], q[i] = cn, sw[i] * v
            i = i[moved]
    return c, frozen




def _c_residual(N, q, sw, sb, c):
    """f(c) - c for the c-map f(c) = (sigma_w2 C(q, q, c q) + sigma_b2)/q at the variance q."""
    return (sw * N.C_eq(q, c) + sb) / q - c


def _c_star_refined(N, sw, sb, c0, q0):
    """c* to dps digits: the float64 root c0 (q* = q0) refined on the mp c-map by :meth:`_Mp.refine`
    (within 1e-9 of c0); c1 and +-1 are exact."""
    with mpmath.workdps(N.dps + 10):
        swm, sbm = to_mpf(sw), to_mpf(sb)
        c1 = sbm / (swm + sbm) if swm + sbm > 0 else mpmath.mpf(0)
        if abs(c0) == 1:
            return mpmath.mpf(c0)
        if c0 == float(c1):
            return +c1
        if not 0 < q0 < math.inf:
            raise Unsupported("c_star(dps=...) with q* = 0 or inf (a limit map) is float64 only.")
        qs = N.ctx.run(partial(q_star_points, N), [sw], [sb])[0]
        root = N.ctx.refine(lambda c: _c_residual(N, qs, swm, sbm, c), c0, 1e-9, "c_star",
                        lambda r: f"c_star: the mpmath root {mpmath.nstr(r, 12)} left the float64 "
                                  f"bracket around {c0!r}; cannot certify c* at dps={N.dps}")
    with mpmath.workdps(N.dps):
        return +root


GAP_REFINE = 1e-3   # 1 - c* below this is refined on the distance map (float64 c* keeps only ~1e-16 of it)


def gap_star(K, sw, sb, cs, qs):
    """1 - c* to float64 relative accuracy (where c* is near 1) for 1-D arrays: the nonzero root of the
    distance map's fixed-point equation sigma_w2 D(q*, q*, d)/d = 1 (no bias term, no cancellation:
    docs/theory.md section 7), d* = 2 q* (1 - c*), bracketed around the float64 c*. Elsewhere 1 - c*."""
    gap = 1.0 - np.asarray(cs, float)
    sel = np.nonzero((gap > 0) & (gap < GAP_REFINE) & (qs > 0) & (qs < math.inf))[0]
    M = maps(K)
    if sel.size == 0 or not M.D_exact:
        return gap
    fn = M.D
    q, w = qs[sel], sw[sel]

    def h(dv, k):
        qq = q[k]
        return w[k] * fn(qq, qq, qq - dv / 2, dv) / dv - 1.0

    d0 = 2 * q * gap[sel]
    lo, hi = d0 / 16, np.minimum(16 * d0, 2 * q)
    k = np.arange(sel.size)
    hlo, hhi = h(lo, k), h(hi, k)
    ok = np.nonzero((hlo > 0) & (hhi < 0))[0]
    if ok.size:
        root = vroot(lambda x, j: h(x, ok[j]), lo[ok], hi[ok], hlo[ok], hhi[ok])
        gap[sel[ok]] = root / (2 * q[ok])
    return gap


def _c_star_solve(N, sw, sb):
    """c* on flat arrays: float64 by :func:`c_star_f64`; at dps each point refined."""
    cs, qs = c_star_f64(N.K, sw, sb)
    if N.dps is None:
        return cs
    return objects([_c_star_refined(N, *p) for p in zip(sw.tolist(), sb.tolist(), cs.tolist(), qs.tolist())])


def c_star(act: str | Activation, sigma_w2: ArrayLike, sigma_b2: ArrayLike,
           dps: int | None = None, norm: str | None = None, norm_at: str = "before",
           batch: int | None = None) -> float | NDArray[Any] | mpmath.mpf:
    """Stable correlation fixed point c* reached from c^(1) (float64 arrays; dps=N: mpmath).

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).
    sigma_w2, sigma_b2 : array_like
        Weight and bias variances (>= 0); arrays broadcast.
    dps : int, optional
        None for float64; N for mpmath numbers correct to N digits.
    norm, norm_at, batch : optional
        Normalisation (docs/theory.md section 12; float64 only): the normalised c-map's stable fixed point
        reached from the inputs' c = 0, or the BatchNorm batch fixed point.

    Returns
    -------
    float, ndarray or mpmath.mpf
        c* in [-1, 1]; c* = 1 in the ordered phase.

    Examples
    --------
    >>> round(sf.c_star("tanh", 2.5, 0.05), 10)
    0.4468042323
    """
    opts = nm.options("c_star", norm, norm_at, batch)
    if opts is not None:
        if dps is not None:
            check.fail("c_star", "dps", "None with norm (the normalised c* is float64)", dps)
        return nm.c_star_grid(kernel(act), opts, check.real("c_star", "sigma_w2", sigma_w2, lo=0),
                              check.real("c_star", "sigma_b2", sigma_b2, lo=0))
    return on_grid("c_star", act, sigma_w2, sigma_b2, dps, _c_star_solve)
