"""Numeric rules for the pooled Gaussian integrals (max-pool order statistics, level sets).

Dispatches a pool integral to its rule: the order-statistic densities of a monotone phi
(quadrature.max_expect1/max_expect2, and the float64 pair-law rule), in float64 the covariance E[f(M_u) g(M_v)]
by Hoeffding's identity where it applies (hoeffding.py) or, for phi not monotone, the generalised order
statistics of phi's level sets (levelsets.py).
"""
from __future__ import annotations

from symfield.core.errors import NoRule, Unsupported
import math

import mpmath
import sympy as sp

from symfield.numeric.pool import hoeffding as HF
from symfield.numeric.pool import levelsets as LS
from symfield.numeric.quadrature import GUARD, elementwise, max_expect1, max_expect2
from symfield.symbolic.formula import X as x
from symfield.symbolic.integrals import Integrand, Kind

# ---------------------------------------------------------------- non-monotone max-pool (level sets)
# Generalised order statistics (symfield/levelsets.py): the argmax node u_A has density
# k F_q(phi(u))^(k-1) n_q(u), F_q(y) = P(u in {phi <= y}); the argmax pair (u_A, v_B) has density
# k H^(k-1) rho + k(k-1) H^(k-2) P1 P2 n n.  Integrands: Kind.LEVEL1 (f, phi), Kind.LEVEL2 (f, g, phi, argmax_only).
def _flat_values(phi, kinks):
    """Values of phi on the intervals (between kinks) where phi' vanishes identically (mpmath, 30 digits)."""
    kk = sorted(float(k) for k in kinks)
    if not kk:
        return []
    d1 = sp.lambdify(x, sp.diff(phi, x), modules="mpmath")
    f0 = sp.lambdify(x, phi, modules="mpmath")
    spans = [(kk[0] - 3.1, kk[0])] + list(zip(kk[:-1], kk[1:])) + [(kk[-1], kk[-1] + 3.1)]
    out = []
    with mpmath.workdps(30):
        for a, b in spans:
            pts = [mpmath.mpf(a) + (mpmath.mpf(b) - a) * t for t in (mpmath.mpf("0.31"), mpmath.mpf("0.5"), mpmath.mpf("0.73"))]
            if all(mpmath.mpmathify(d1(t)) == 0 for t in pts):
                out.append((a, b, float(mpmath.mpmathify(f0(pts[1])))))
    return out


def _shifted(phi, kinks):
    """(y0, phi - y0, flats): phi's value y0 on its flat pieces (0 if none; max_j phi = y0 + max_j (phi - y0),
    and phi - y0 vanishes on the flats)."""
    flats = _flat_values(phi, kinks)
    y0 = 0.0
    if flats:
        vals = sorted({v for *_, v in flats})
        if len(vals) > 1:
            raise Unsupported(f"max-pool of an activation that is constant at several different values "
                                      f"({', '.join(f'{v:g}' for v in vals)}) on intervals is not supported: ties "
                                      f"between nodes have positive probability there.")
        y0 = vals[0]
    return y0, (phi - sp.nsimplify(y0) if y0 else phi), flats


def _lower(f, phi, y0, flats):
    """f as a polynomial in phi (coefficients c0, c1, c2, ... of (phi - y0)^m) when it does not vanish on the
    flats, else None."""
    if not y0:
        return None
    Y = sp.Symbol("Y")
    g = sp.expand(sp.sympify(f).subs(phi, Y + sp.nsimplify(y0)))
    if g.has(x) or not g.is_polynomial(Y):
        if any(abs(float(sp.sympify(f).subs(x, (a + b) / 2))) > 0 for a, b, _ in flats):
            raise Unsupported("max-pool of an activation with a flat piece: this integrand does not "
                                      "vanish on the flat piece (ties between nodes).")
        return None
    return [float(c) for c in reversed(sp.Poly(g, Y).all_coeffs())]


def _levels_pool(spec: Integrand, kinks, dps, vectorise, numpy_modules):
    """Numeric callable for the level-set (non-monotone max-pool) integrals."""
    k, phi = spec.k, spec.phi
    y0, pt, flats = _shifted(phi, kinks)
    key = sp.srepr(pt)
    ph, dph = vectorise(pt, numpy_modules), vectorise(sp.diff(pt, x), numpy_modules)

    def lv(s):
        return LS.levels(key, ph, dph, kinks, s)

    if spec.kind is Kind.LEVEL1:
        return _level1(spec.f, pt, k, lv, _lower(spec.f, phi, y0, flats), dps, vectorise, numpy_modules)
    cf, cg = _lower(spec.f, phi, y0, flats), _lower(spec.g, phi, y0, flats)
    if dps is not None:
        if cf is not None or cg is not None:
            raise NoRule("dps= is not available for the max-pool covariance of an activation with a flat "
                                      "piece at a nonzero value.")
        return _level2_mp(spec, pt, k, lv, dps, vectorise)
    f, g = spec.f, spec.g
    if cf is not None or cg is not None:
        if not (cf == [y0, 1.0] and cg == [y0, 1.0]):
            raise Unsupported("max-pool of an activation with a flat piece: covariance integrand not supported.")
        f = g = pt
    fv, gv = vectorise(f, numpy_modules), vectorise(g, numpy_modules)

    def two(a, b, c):
        L = lv(math.sqrt(max(a, b)))
        val = LS.argmax_expect2(fv, gv, a, b, c, k, L, spec.argmax_only)
        if cf is not None:
            val += y0 * (LS.argmax_expect1(fv, a, k, L) + LS.argmax_expect1(fv, b, k, L)) + y0 * y0
        return val
    return lambda a, b, c: elementwise(two, (a, b, c), None)


def _level1(f, pt, k, lv, coef, dps, vectorise, numpy_modules):
    """E[f(u_A)] (Kind.LEVEL1) for phi - y0 = pt: f itself, or coef[0] + sum_m coef[m] E[pt(u_A)^m]."""
    if dps is not None:
        fm, pm, dm = (vectorise(e, "mpmath") for e in (f, pt, sp.diff(pt, x)))
        if coef is not None:
            raise NoRule("dps= is not available for max-pool of an activation with a flat piece at a "
                                      "nonzero value.")

        def run_mp(qv):
            with mpmath.workdps(dps + GUARD):
                return LS.argmax_expect1_mp(fm, pm, dm, qv, k, lv(math.sqrt(float(qv))), dps)
        return run_mp
    fs = [vectorise(pt**m, numpy_modules) for m in range(len(coef))] if coef else [vectorise(f, numpy_modules)]

    def one(qv):
        L = lv(math.sqrt(qv))
        if coef is None:
            return LS.argmax_expect1(fs[0], qv, k, L)
        return coef[0] + sum(c * LS.argmax_expect1(fs[m], qv, k, L) for m, c in enumerate(coef) if m and c)
    return lambda qv: elementwise(one, (qv,), None)


def _level2_mp(spec, pt, k, lv, dps, vectorise):
    """E[f(u_A) g(v_B)] (Kind.LEVEL2) at dps digits: c = 0 factorises (A = B with probability 1/k),
    c = 1 with q1 = q2 is the 1-D law, else levelsets.argmax_expect2_mp."""
    argmax_only = spec.argmax_only
    fm, gm, pm, dm = (vectorise(e, "mpmath") for e in (spec.f, spec.g, pt, sp.diff(pt, x)))

    def run2_mp(a, b, c):
        with mpmath.workdps(dps + GUARD):
            a, b, c = (mpmath.mpf(v) for v in (a, b, c))
            L = lv(math.sqrt(float(max(a, b))))
            with mpmath.workprec(2 * mpmath.mp.prec + 20):
                det = a * b - c * c
            if c == 0:              # independent argmax nodes; A = B with probability 1/k
                e1 = []
                for h, qv in ((fm, a), (gm, b)):   # error <= 10^-dps sqrt(E h(u_A)^2) per factor (natural scale)
                    Lq = lv(math.sqrt(float(qv)))
                    sc = mpmath.sqrt(LS.argmax_expect1_mp(lambda t: h(t) ** 2, pm, dm, qv, k, Lq, dps))
                    e1.append(LS.argmax_expect1_mp(h, pm, dm, qv, k, Lq, dps, scale=sc))
                return e1[0] * e1[1] / k if argmax_only else e1[0] * e1[1]
            if det <= 0 and c > 0 and a == b:   # v = u: A = B
                return LS.argmax_expect1_mp(lambda t: fm(t) * gm(t), pm, dm, a, k, L, dps)
            if det <= 0:
                raise NoRule("dps= for the max-pool covariance maps of a non-monotone activation "
                                          "at |c| = 1 is available only for c = 1, q1 = q2.")
            return LS.argmax_expect2_mp(fm, gm, pm, dm, a, b, c, k, L, dps, argmax_only)
    return run2_mp


# ---------------------------------------------------------------- monotone max-pool covariance, float64
def _hoeffding(spec: Integrand, kinks, vectorise, numpy_modules):
    """Hoeffding's rule (hoeffding.Max2) of a MAX2 integral: f, g with finite derivatives on [-40, 40], else None."""
    fp, gp = (sp.diff(e, x) for e in (spec.f, spec.g))
    if any(e.has(sp.DiracDelta, sp.Derivative, sp.Subs) for e in (fp, gp)):
        return None
    try:
        dv = [vectorise(e, numpy_modules) for e in (fp, gp)]
        v0 = [float(sp.sympify(e).subs(x, 0)) for e in (spec.f, spec.g)]
        return HF.Max2(dv[0], dv[1] if gp != fp else dv[0], v0[0], v0[1], spec.k, kinks)
    except (ValueError, TypeError, ArithmeticError):     # f' not finite on [-40, 40], f(0) not a number
        return None


def _max2_f64(hoeff, f, g, q1, q2, q12, k, kinks):
    """E[f(M_u) g(M_v)]: Hoeffding's rule for |c| <= hoeffding.C_MAX where it is finite, else the h_k quadrature
    (max_expect2, which flags or raises what it cannot resolve)."""
    q1, q2, q12 = float(q1), float(q2), float(q12)
    if q1 > 0 and q2 > 0 and abs(q12) <= HF.C_MAX * math.sqrt(q1 * q2):
        out = hoeff(q1, q2, q12)
        if math.isfinite(out):
            return out
    return max_expect2(f, g, q1, q2, q12, k, kinks=kinks)


def pool_impl(spec: Integrand, kinks, dps, vectorise, numpy_modules):
    """Numeric callable of a pooled GaussianIntegral (Kind MAX1, MAX2, ARGMAX2, LEVEL1, LEVEL2)."""
    kind, k = spec.kind, spec.k
    if kind in (Kind.LEVEL1, Kind.LEVEL2):
        return _levels_pool(spec, kinks, dps, vectorise, numpy_modules)
    if kind is Kind.MAX1:
        f = vectorise(spec.f, numpy_modules if dps is None else "mpmath")
        if dps is not None:
            return lambda qv: max_expect1(f, qv, k, kinks=kinks, dps=dps)
        return lambda qv: elementwise(lambda a: max_expect1(f, a, k, kinks=kinks), (qv,), None)
    f, g = (vectorise(e, numpy_modules if dps is None else "mpmath") for e in (spec.f, spec.g))
    if dps is None and kind is Kind.MAX2:
        hoeff = _hoeffding(spec, kinks, vectorise, numpy_modules)
        if hoeff is not None:
            return lambda a, b, c: elementwise(lambda x1, x2, x3: _max2_f64(hoeff, f, g, x1, x2, x3, k, kinks),
                                               (a, b, c), None)
    if dps is not None:
        return lambda a, b, c: max_expect2(f, g, a, b, c, k, kinks=kinks, argmax_only=kind is Kind.ARGMAX2, dps=dps)
    return lambda a, b, c: elementwise(lambda x1, x2, x3: max_expect2(f, g, x1, x2, x3, k, kinks=kinks,
                                                               argmax_only=kind is Kind.ARGMAX2), (a, b, c), None)
