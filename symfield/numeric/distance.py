"""Numbers of the distance map D(q1, q2, q12, d) = E[(psi(u) - psi(v))^2] (docs/theory.md section 7).

One callable per kernel and number type, ``D(q1, q2, q12, d)`` (float64 arrays, or mpmath at dps):

- closed forms: the symbolic forms of :func:`symfield.symbolic.distance.distance` -- in d where c >= 1/2,
  in q12 elsewhere;
- smooth single-node psi without a closed form, equal norms, d <= SERIES_D: a mean-value form in float64
  (:func:`_meanvalue_f64`), a series in d in mpmath (:func:`_series_mp`);
- avg-pools: D_phi / k + (1 - 1/k) (mean(q1) - mean(q2))^2;
- otherwise the plain difference V(q1) + V(q2) - 2 C(q1, q2, q12), with extra digits in mpmath; in
  float64 it loses digits as c -> 1 (``exact`` False says so).

The forms and the series: docs/numerics.md section 6.
"""
from __future__ import annotations

from symfield.core.errors import PrecisionError
import math
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import numpy as np
import sympy as sp

from symfield.numeric import quadrature as QD
from symfield.numeric.evaluate import GUARD_DIGITS, NUMPY_MODULES, evaluate, to_mpf, vectorised
from symfield.symbolic.distance import d as DD, distance
from symfield.symbolic.formula import X as x
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12
from symfield.symbolic.kernel_type import Kernel

SERIES_D = 1e-4       # the small-d rules are used for d <= SERIES_D (above, the plain difference loses ~ 1e-16 V/d)


@dataclass(frozen=True)
class DistanceRule:
    """``fn(q1, q2, q12, d)`` and whether it keeps relative accuracy as d -> 0 at equal norms."""
    fn: object
    exact: bool
    method: str


@lru_cache(maxsize=64)
def rule(K: Kernel, dps: int | None = None) -> DistanceRule:
    """The numeric distance map of ``K`` (float64 when dps is None, else mpmath at dps digits)."""
    dist = distance(K)
    if dist.near_eq is not None and dist.stable:
        return DistanceRule(_closed(K, dist, dps), True, dist.method)
    if K.act.pool == "avg" and K.act.k > 1 and K.base is not None:
        base = rule(K.base, dps)
        k = K.act.k

        def avg(a, b, c, dv):
            m1, m2 = (evaluate(K.base.mean, (Q,), (v,), K.kinks, dps) for v in (a, b))
            return base.fn(a, b, c, dv) / k + (1 - 1 / k) * (m1 - m2) ** 2
        return DistanceRule(avg, base.exact, f"avg-pool identity ({base.method})")
    if (K.act.pool is None or K.act.k == 1) and not K.kinks:
        return DistanceRule(_series_rule(K, dps), True, "mean-value form (float64) / series in d (mpmath) for d <= 1e-4, plain difference above")
    return DistanceRule(_plain_rule(K, dps), False, "plain difference V + V - 2C (loses digits as c -> 1)")


def _closed(K, dist, dps):
    def fn(a, b, c, dv):
        if dps is not None:
            if dv <= (a + b) / 2:
                if a == b:
                    return evaluate(dist.near_eq, (Q, DD), (a, dv), K.kinks, dps)
                return evaluate(dist.near, (Q1, Q2, DD), (a, b, dv), K.kinks, dps)
            return evaluate(dist.far, (Q1, Q2, Q12), (a, b, c), K.kinks, dps)
        a, b, c, dv = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, c, dv)))
        near = dv <= 0.5 * (a + b)
        out = np.empty(a.shape)
        for sel, expr, syms, vals in ((near & (a == b), dist.near_eq, (Q, DD), (a, dv)),
                                      (near & (a != b), dist.near, (Q1, Q2, DD), (a, b, dv)),
                                      (~near, dist.far, (Q1, Q2, Q12), (a, b, c))):
            if sel.any():       # each form only where it applies (the d-forms are not defined for d > 4q)
                out[sel] = evaluate(expr, syms, tuple(v[sel] for v in vals), K.kinks)
        return out
    return fn


def _plain_rule(K, dps):
    def fn(a, b, c, dv):
        if dps is None:
            return (evaluate(K.V, (Q,), (a,), K.kinks) + evaluate(K.V, (Q,), (b,), K.kinks)
                    - 2 * evaluate(K.C, (Q1, Q2, Q12), (a, b, c), K.kinks))
        a, b, dv = to_mpf(a), to_mpf(b), to_mpf(dv)
        scale = max(a, b, mpmath.mpf(1))
        extra = int(max(0, mpmath.log10(scale / dv))) + GUARD_DIGITS if dv > 0 else 0
        work = dps + extra
        with mpmath.workdps(work):
            c = (a + b - dv) / 2      # q12 from d, at the working precision
            out = (evaluate(K.V, (Q,), (a,), K.kinks, work) + evaluate(K.V, (Q,), (b,), K.kinks, work)
                   - 2 * evaluate(K.C, (Q1, Q2, Q12), (a, b, c), K.kinks, work))
        with mpmath.workdps(dps):
            return +out
    return fn


@lru_cache(maxsize=64)
def _derivative_pairs(phi: sp.Expr, terms: int):
    """[(k, coefficient, psi^(i), psi^(j))] of the series (docs/numerics.md section 6)."""
    out = []
    for k in range(1, terms + 1):
        dfact = sp.factorial2(2 * k - 1)
        for i in range(1, 2 * k, 2):
            j = 2 * k - i
            coef = dfact * 4 / (sp.Integer(4) ** k * sp.factorial(i) * sp.factorial(j))
            out.append((k, coef, sp.diff(phi, x, i), sp.diff(phi, x, j)))
    return tuple(out)


_GL_T, _GL_W = np.polynomial.legendre.leggauss(6)
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(16)


# paired with _series_mp: float64 takes D from psi' alone, mpmath sums the series with guard digits (docs/numerics.md section 7)
def _meanvalue_f64(K, v, dv):
    """D at small d in float64 from psi' alone (no cancellation): with delta = sqrt(d) w,
    psi(m + delta/2) - psi(m - delta/2) = delta int_{-1/2}^{1/2} psi'(m + t delta) dt, so
        D = d E_w[w^2 E_m[(int psi'(m + t sqrt(d) w) dt)^2]],   m ~ N(0, v = q - d/4),
    by 6-point Gauss-Legendre in t and 16-point Gauss-Hermite in w (equal to the series in d to ~14 orders)."""
    phi = K.act.expr if K.base is None else K.base.act.expr
    f1 = vectorised(sp.diff(phi, x), NUMPY_MODULES)
    ts, tw = _GL_T / 2, _GL_W / 2
    pos = _GH_X > 0
    ws, ww = _GH_X[pos], 2 * _GH_W[pos] / math.sqrt(2 * math.pi)
    out = np.empty(np.shape(v))
    for i, (vi, di) in enumerate(zip(np.ravel(v), np.ravel(dv))):
        total = 0.0
        for w, W in zip(ws, ww):
            h = math.sqrt(di) * w

            def F(t, h=h):
                return (f1(np.add.outer(t, ts * h)) @ tw) ** 2
            total += W * w * w * QD.expect1(F, float(vi), name=f"psi' of {K.act.name} (distance map)")
        out.flat[i] = di * total
    return out


def _series_mp(K, v, dv, dps):
    """The series in mpmath: terms until |term| < 10^-(dps + GUARD_DIGITS) |sum| (at most 40 orders)."""
    phi = K.act.expr if K.base is None else K.base.act.expr
    total, k_max = mpmath.mpf(0), 1
    while k_max <= 40:
        pairs = [p for p in _derivative_pairs(phi, k_max) if p[0] == k_max]
        term = mpmath.mpf(0)
        for _, coef, fi, fj in pairs:
            f = vectorised(fi * fj, "mpmath")
            term += mpmath.mpf(sp.Rational(coef).p) / sp.Rational(coef).q * QD.expect1(f, v, dps=dps)
        term *= dv ** k_max
        total += term
        if abs(term) <= mpmath.mpf(10) ** -(dps + GUARD_DIGITS) * abs(total):
            return total
        k_max += 1
    raise PrecisionError(f"the series of the distance map of {K.act.name} did not converge at d = {mpmath.nstr(dv, 5)}")


def _series_rule(K, dps):
    plain = _plain_rule(K, dps)

    def fn(a, b, c, dv):
        if dps is not None:
            if a == b and dv <= to_mpf(SERIES_D):
                with mpmath.workdps(dps + GUARD_DIGITS):
                    return _series_mp(K, to_mpf(a) - to_mpf(dv) / 4, to_mpf(dv), dps + GUARD_DIGITS)
            return plain(a, b, c, dv)
        a, b, c, dv = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (a, b, c, dv)))
        small = (a == b) & (dv <= SERIES_D)
        out = np.empty(a.shape)
        if np.any(small):
            out[small] = _meanvalue_f64(K, a[small] - dv[small] / 4, dv[small])
        if np.any(~small):
            out[~small] = plain(a[~small], b[~small], c[~small], dv[~small])
        return out
    return fn
