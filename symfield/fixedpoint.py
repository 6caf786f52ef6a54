"""Fixed points of the variance map, by bracketing root finding (never by iterating the map).

    q* solves g(q) = sigma_w2 V(q) + sigma_b2 - q = 0,

the first root above 0 in the direction the recursion moves from small q (the fixed point
that the layer recursion reaches and that is stable from below). q* = 0 when sigma_b2 = 0 and
g < 0 just above 0; q* = inf when g > 0 on the whole bracket (the variance grows without bound,
e.g. ReLU with sigma_w2 > 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath
import numpy as np

from . import validate as check
from .gaussian import q as Q
from .kernel import kernel
from .numeric import evaluate, to_mpf

Q_MIN, Q_MAX = 1e-12, 1e12


def _grow(f, hi):
    """Multiply hi by 4 until f(hi) <= 0; None once hi passes Q_MAX (no sign change)."""
    while f(hi) > 0:
        hi *= 4
        if hi > Q_MAX:
            return None
    return hi


def _root(f, lo, hi, dps, what):
    """Bracketed root of f on [lo, hi]: brentq in float64; mpmath (anderson) with dps, verified by
    its residual (ArithmeticError with achieved vs required error)."""
    if dps is None:
        from scipy.optimize import brentq
        return brentq(lambda t: float(f(t)), lo, hi, xtol=1e-300, rtol=8.9e-16, maxiter=500)
    root = mpmath.findroot(f, (lo, hi), solver="anderson", tol=mpmath.mpf(10) ** (-2 * dps))
    resid = abs(f(root))
    if resid > mpmath.mpf(10) ** (-dps) * max(1, abs(root)):
        raise ArithmeticError(f"{what}: residual {mpmath.nstr(resid, 3)} exceeds the required "
                              f"{mpmath.nstr(mpmath.mpf(10) ** -dps, 3)} (dps={dps})")
    return root


def _limit_q(K, qs):
    """Where to evaluate q-dependent quantities when q* is 0 or inf: q = 1 for positively
    homogeneous psi (they do not depend on q), else q = 1e-8 (q* = 0) or 1e8 (q* = inf)."""
    from .gaussian import _homogeneous
    h = _homogeneous(K.act.expr)
    return 1.0 if h and h[0] == 1 else (1e-8 if qs == 0 else 1e8)


def _q_star_scalar(K, sw, sb, dps):
    def g(qv):
        return sw * evaluate(K.V, (Q,), (qv,), K.kinks, dps) + sb - qv

    if dps is None:
        if float(g(Q_MIN)) <= 0:
            return 0.0 if sb == 0 else math.nan
        hi = _grow(lambda t: float(g(t)), max(2 * (sb + sw), 1.0))
        return math.inf if hi is None else _root(g, Q_MIN, hi, None, "q_star")
    with mpmath.workdps(dps + 10):
        sw, sb = to_mpf(sw), to_mpf(sb)  # decimal reading, as numeric.evaluate
        lo = mpmath.mpf(Q_MIN)
        if g(lo) <= 0:
            return mpmath.mpf(0) if sb == 0 else mpmath.nan
        hi = _grow(g, max(2 * (sb + sw), mpmath.mpf(1)))
        if hi is None:
            return mpmath.inf
        root = _root(g, lo, hi, dps, "q_star")
    with mpmath.workdps(dps):
        return +root


def q_star(act, sigma_w2, sigma_b2, dps=None):
    """The variance fixed point q* (float64 arrays broadcast; dps=N gives mpmath numbers)."""
    K = kernel(act)
    dps = check.dps("q_star", dps)
    sw = check.real("q_star", "sigma_w2", sigma_w2, lo=0)
    sb = check.real("q_star", "sigma_b2", sigma_b2, lo=0)
    sw, sb = np.broadcast_arrays(sw, sb)
    out = np.empty(sw.shape, dtype=float if dps is None else object)
    for idx in np.ndindex(sw.shape):
        out[idx] = _q_star_scalar(K, float(sw[idx]), float(sb[idx]), dps)
    return out if out.ndim else out.item()


@dataclass(frozen=True)
class EOC:
    """A point of the edge-of-chaos curve: chi1(q*) = 1 with q* = sigma_w2 V(q*) + sigma_b2."""
    sigma_b2: float
    sigma_w2: float
    q_star: float


def _eoc_scalar(K, sb, dps):
    """Eliminate sigma_w2 (MATH.md section 2): solve h(q) = V(q)/dpsi2(q) + sigma_b2 - q = 0,
    then sigma_w2 = 1/dpsi2(q*). sigma_b2 = 0: q* = 0 and sigma_w2 = 1/dpsi2(0+) exactly."""
    import sympy as sp
    if sb == 0:
        if not K.dpsi2.has(sp.Integral):   # exact limit of the closed form
            d0 = sp.limit(K.dpsi2, Q, 0, "+")
            if not d0.is_positive:
                raise ValueError(f"{K.act.name} has E[psi'^2] -> 0 as q -> 0: no edge of chaos at sigma_b2 = 0.")
            if dps is None:
                return float(1 / d0), 0.0
            with mpmath.workdps(dps):
                return mpmath.mpf(str(sp.N(1 / d0, dps + 5))), mpmath.mpf(0)
        # integral form: E[psi'^2](q) = E[psi'^2](0+) + O(q); q far below the working precision
        tiny = 1e-40 if dps is None else mpmath.mpf(10) ** (-2 * dps - 10)
        d0 = evaluate(K.dpsi2, (Q,), (tiny,), K.kinks, dps)
        if not d0 > 0:
            raise ValueError(f"{K.act.name} has E[psi'^2] -> 0 as q -> 0: no edge of chaos at sigma_b2 = 0.")
        return (1 / float(d0), 0.0) if dps is None else (1 / d0, mpmath.mpf(0))

    def h(qv):
        V = evaluate(K.V, (Q,), (qv,), K.kinks, dps)
        d = evaluate(K.dpsi2, (Q,), (qv,), K.kinks, dps)
        return V / d + sb - qv

    if not K.V.has(sp.Integral) and sp.simplify(K.V / K.dpsi2 - Q) == 0:
        raise ValueError(f"{K.act.name} is positively homogeneous: chi1 = sigma_w2 dpsi2 does not depend on q, "
                         f"so the EOC is the single point sigma_b2 = 0, sigma_w2 = 1/dpsi2; for sigma_b2 > 0 q* "
                         f"diverges exactly where chi1 = 1 and there is no EOC curve.")
    def none_beyond(sbv):
        return ValueError(f"{K.act.name} has no edge of chaos at sigma_b2 = {sbv} (q* beyond {Q_MAX:g}).")

    if dps is None:
        if h(Q_MIN) <= 0:
            raise ArithmeticError(f"eoc: h(q) <= 0 at q = {Q_MIN:g}; no bracket for the edge of chaos of {K.act.name}.")
        hi = _grow(h, 1.0)
        if hi is None:
            raise none_beyond(f"{sb:g}")
        qs = _root(h, Q_MIN, hi, None, "eoc")
        return 1.0 / float(evaluate(K.dpsi2, (Q,), (qs,), K.kinks)), qs
    with mpmath.workdps(dps + 10):
        sb = to_mpf(sb)
        hi = _grow(h, mpmath.mpf(1))
        if hi is None:
            raise none_beyond(sb)
        qs = _root(h, mpmath.mpf(Q_MIN), hi, dps, "eoc")
        sw = 1 / evaluate(K.dpsi2, (Q,), (qs,), K.kinks, dps)
    with mpmath.workdps(dps):
        return +sw, +qs


def eoc(act, sigma_b2, dps=None) -> EOC:
    """Edge of chaos at ``sigma_b2``: result with .sigma_w2 and .q_star (bracketing root finder)."""
    K = kernel(act)
    dps = check.dps("eoc", dps)
    sb = float(check.real("eoc", "sigma_b2", sigma_b2, lo=0))
    sw, qs = _eoc_scalar(K, sb, dps)
    if dps is not None:
        with mpmath.workdps(dps):
            sb = to_mpf(sb)
    return EOC(sigma_b2=sb, sigma_w2=sw, q_star=qs)


def eoc_curve(act, sigma_b2, dps=None):
    """sigma_w2 on the edge of chaos for each sigma_b2 (array in, array out)."""
    K = kernel(act)
    dps = check.dps("eoc_curve", dps)
    sb = check.real("eoc_curve", "sigma_b2", sigma_b2, lo=0)
    out = np.empty(sb.shape, dtype=float if dps is None else object)
    for idx in np.ndindex(sb.shape):
        out[idx] = _eoc_scalar(K, float(sb[idx]), dps)[0]
    return out


G_TOL = 1e-13  # |f(c) - c| below this counts as a fixed point (the maps' float64 accuracy)
SCAN = 64  # grid points scanned for the first sign change of the c-map on the way from c^(1)


def _c_star_scalar(K, sw, sb):
    """Stable fixed point of f(c) = (sigma_w2 C(q*, q*, c q*) + sigma_b2)/q* reached from
    c1 = sigma_b2/(sigma_w2 + sigma_b2): the first root of f(c) - c in the direction f moves c1.
    q* = 0 or inf: the normalised map c' = C(q, q, c q)/V(q) in that limit (see below)."""
    from scipy.optimize import brentq

    from .gaussian import q1 as Q1, q2 as Q2, q12 as Q12
    qs = _q_star_scalar(K, sw, sb, None)
    c1 = sb / (sw + sb) if sw + sb > 0 else 0.0
    if 0 < qs < math.inf:
        def g(c):
            return float((sw * evaluate(K.C, (Q1, Q2, Q12), (qs, qs, c * qs), K.kinks) + sb) / qs - c)
    else:
        # q -> 0 or inf: sigma_b2 is negligible against q and the correlation follows the
        # normalised map c' = C(q, q, c q)/V(q) (exact for homogeneous psi)
        qe = _limit_q(K, qs)
        vq = float(evaluate(K.V, (Q,), (qe,), K.kinks))

        def g(c):
            return float(evaluate(K.C, (Q1, Q2, Q12), (qe, qe, c * qe), K.kinks)) / vq - c

    g1 = g(c1)
    if abs(g1) <= G_TOL or sw == 0:  # c1 is a fixed point to the accuracy of the maps
        return c1, qs
    end = 1.0 if g1 > 0 else -1.0
    prev_c, prev_g = c1, g1
    for i in range(1, SCAN):
        c = c1 + (end - c1) * i / SCAN
        gc = g(c)
        if abs(gc) <= G_TOL:
            return c, qs
        if (gc > 0) != (prev_g > 0):
            return brentq(g, prev_c, c, xtol=1e-15, rtol=8.9e-16, maxiter=200), qs
        prev_c, prev_g = c, gc
    return end, qs  # no crossing before c = +-1: the recursion runs to the boundary (c* = 1 or -1)


def c_star(act, sigma_w2, sigma_b2, dps=None):
    """Stable correlation fixed point c* reached from c^(1) (float64; vectorised by a loop)."""
    K = kernel(act)
    if dps is not None:
        raise NotImplementedError("c_star(dps=...) needs the mpmath covariance map at every step; "
                                  "only float64 is supported so far.")
    sw = check.real("c_star", "sigma_w2", sigma_w2, lo=0)
    sb = check.real("c_star", "sigma_b2", sigma_b2, lo=0)
    sw, sb = np.broadcast_arrays(sw, sb)
    out = np.empty(sw.shape)
    for idx in np.ndindex(sw.shape):
        out[idx] = _c_star_scalar(K, float(sw[idx]), float(sb[idx]))[0]
    return out if out.ndim else float(out)


def neutrality(act, sigma_b2, sigma_w2_max=50.0):
    """sigma_w2 where c* = 1/2 (gamma* = 1), by bracketing root finding on c*(sigma_w2) - 1/2.

    The bracket starts at the edge of chaos (c* = 1 below it) and grows geometrically up to
    ``sigma_w2_max``; if c* never drops below 1/2 there, no neutrality line exists in the range."""
    from scipy.optimize import brentq
    K = kernel(act)
    sb = float(check.real("neutrality", "sigma_b2", sigma_b2, lo=0, lo_open=True))
    try:
        lo = _eoc_scalar(K, sb, None)[0]
    except ValueError:
        lo = 1e-3
    h = lambda w: _c_star_scalar(K, w, sb)[0] - 0.5  # noqa: E731
    if h(lo) <= 0:
        raise ValueError(f"neutrality: c* <= 1/2 already at sigma_w2 = {lo:g} for {K.act.name} at sigma_b2 = {sb:g}.")
    hi = lo * 1.5
    while h(hi) > 0:
        lo, hi = hi, hi * 1.5
        if hi > sigma_w2_max:
            raise ValueError(f"{K.act.name} has no neutrality line at sigma_b2 = {sb:g} for sigma_w2 <= "
                             f"{sigma_w2_max:g}: c* stays above 1/2 (prejudiced) there.")
    return brentq(h, lo, hi, xtol=1e-13, rtol=8.9e-16, maxiter=200)


PHASES = ("ordered-deep-prejudice", "edge-of-chaos", "chaotic-deep-prejudice", "prejudice", "neutrality")


@dataclass(frozen=True)
class Phase:
    """The phase of one initialisation (Table 1 of Bassi et al.) and the fields that decided it."""
    label: str
    q_star: float
    c_star: float
    gamma_star: float
    slope: float


def phase(act, sigma_w2, sigma_b2, eoc_tol=1e-6, full=False):
    """One of PHASES. c* = 1 (gamma* = inf): ordered / edge-of-chaos / chaotic by the slope
    chi1 (< 1, |chi1 - 1| <= eoc_tol, > 1); c* in (1/2, 1): prejudice; c* <= 1/2: neutrality.
    chi1 is taken at q* (at q = 1 for positively homogeneous psi when q* is 0 or inf, where it
    does not depend on q). ``full=True`` returns a :class:`Phase` with q*, c*, gamma*, slope."""
    K = kernel(act)
    sw = float(check.real("phase", "sigma_w2", sigma_w2, lo=0))
    sb = float(check.real("phase", "sigma_b2", sigma_b2, lo=0))
    tol = float(check.real("phase", "eoc_tol", eoc_tol, lo=0))
    cs, qs = _c_star_scalar(K, sw, sb)
    qe = qs if 0 < qs < math.inf else _limit_q(K, qs)
    slope = sw * float(evaluate(K.dpsi2, (Q,), (qe,), K.kinks))
    gamma = math.inf if cs >= 1 else cs / (1 - cs)
    if cs >= 1:
        label = PHASES[1] if abs(slope - 1) <= tol else (PHASES[0] if slope < 1 else PHASES[2])
    else:
        label = PHASES[3] if cs > 0.5 else PHASES[4]
    return Phase(label, qs, cs, gamma, slope) if full else label


def _depth_scale(func, act, sigma_w2, sigma_b2, slope_of):
    K = kernel(act)
    sw = check.real(func, "sigma_w2", sigma_w2, lo=0, lo_open=True)
    sb = check.real(func, "sigma_b2", sigma_b2, lo=0)
    sw, sb = np.broadcast_arrays(sw, sb)
    out = np.empty(sw.shape)
    for idx in np.ndindex(sw.shape):
        cs, qs = _c_star_scalar(K, float(sw[idx]), float(sb[idx]))
        if not 0 < qs < math.inf:
            out[idx] = math.nan  # no finite variance fixed point: the depth scale is not defined
            continue
        chi = float(sw[idx]) * slope_of(K, qs, cs)
        out[idx] = math.inf if chi >= 1 else -1 / math.log(chi)
    return out if out.ndim else float(out)


def xi_q(act, sigma_w2, sigma_b2):
    """Depth scale of q: 1/xi_q = -ln[sigma_w2 E(phi'^2 + phi phi'')(q*)] = -ln[sigma_w2 V'(q*)]
    (Schoenholz et al. 2017); inf where the slope reaches 1, NaN where q* is 0 or inf."""
    return _depth_scale("xi_q", act, sigma_w2, sigma_b2,
                        lambda K, qs, cs: float(evaluate(K.dV, (Q,), (qs,), K.kinks)))


def xi_c(act, sigma_w2, sigma_b2):
    """Depth scale of c: 1/xi_c = -ln[sigma_w2 E phi'(u) phi'(v)] at (q*, c*); diverges at the EOC."""
    from .gaussian import q1 as Q1, q2 as Q2, q12 as Q12
    return _depth_scale("xi_c", act, sigma_w2, sigma_b2,
                        lambda K, qs, cs: float(evaluate(K.dC, (Q1, Q2, Q12), (qs, qs, cs * qs), K.kinks)))
