"""Derivatives of expressions holding Gaussian integrals, without differentiating a density.

For one input, scaling the node: d/dq E[f(sqrt(q) M)] = E[(x f')(sqrt(q) M)]/(2q) (M standard normal, or
the maximum of k of them). For two inputs (u, v) ~ N(0, [[q1, q12], [q12, q2]]):

    dI/dq12 = E[f'(u) g'(v)]                                     (Price's theorem)
    dI/dq1  = (E[(x f')(u) g(v)] - q12 E[f'(u) g'(v)]) / (2 q1)   (scale u by s: 2 q1 d1 + q12 d12 = d/ds)

and the same with the roles swapped for q2. The derivative integrals are new GaussianIntegrals the
quadrature layer evaluates. x f' must be free of point masses away from 0, and f', g' free of any for
the two-input rule; max-pool pairs (two inputs) have no rule here.
"""
from __future__ import annotations

from symfield.core.errors import NoRule, Unsupported
import sympy as sp

from symfield.symbolic import gaussian as G
from symfield.symbolic.formula import X as x
from symfield.symbolic.integrals import GaussianIntegral, Kind
from symfield.symbolic.pool import max_integral1

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12


def drop_vanishing_deltas(g, f):
    """Remove terms c(x) DiracDelta(x - a) with c(a) = 0 (e.g. x f'(x) for a kink at 0); refuse others."""
    out = sp.Integer(0)
    for term in sp.Add.make_args(g):
        deltas = [fac for fac in sp.Mul.make_args(term) if isinstance(fac, sp.DiracDelta)]
        if not term.has(sp.DiracDelta):
            out += term
        elif len(deltas) == 1 and len(deltas[0].args) == 1:
            a = sp.solve(deltas[0].args[0], x)
            c = term / deltas[0]
            if len(a) == 1 and not c.has(sp.DiracDelta) and sp.simplify(c.subs(x, a[0])) == 0:
                continue
            raise Unsupported(f"the derivative needs x f'(x) without point masses; f = {f} jumps.")
        else:
            raise Unsupported(f"the derivative needs x f'(x) without point masses; f = {f} jumps.")
    return out


def _xd(f):
    """x f'(x), with the point masses that x kills removed."""
    return drop_vanishing_deltas(sp.expand(x * sp.diff(f, x)), f)


def _deriv(f):
    d = sp.diff(f, x)
    if d.has(sp.DiracDelta):
        raise Unsupported(f"{f} has a jump: its derivative has a point mass")
    return d


def _d_integral(I, var, pair):
    """dI/dvar for one GaussianIntegral; ``pair(f, g)`` builds E[f(u) g(v)] (closed form or integral)."""
    spec = I.integrand
    if spec.kind in (Kind.NORMAL1, Kind.MAX1):
        s = I.scale()
        if var != s:
            return sp.Integer(0)
        g = _xd(spec.f)
        new = G.integral1(g) if spec.kind is Kind.NORMAL1 else max_integral1(g, spec.k)
        return new.subs(q, s) / (2 * s)
    if spec.kind is not Kind.NORMAL2:
        raise NoRule(f"no derivative rule for a {spec.kind.value} integral")
    f, g = spec.f, spec.g
    d12 = pair(_deriv(f), _deriv(g))
    if var == q12:
        return d12
    if var == q1:
        return (pair(_xd(f), g) - q12 * d12) / (2 * q1)
    return (pair(f, _xd(g)) - q12 * d12) / (2 * q2)


def d(expr, var, pair=lambda f, g: G.expect2(f, g).value):
    """d expr / d var (var one of q, q1, q2, q12): closed parts by sympy.diff, integrals by the rules above."""
    ints = sorted(expr.atoms(GaussianIntegral), key=sp.default_sort_key)
    plain = expr.atoms(sp.Integral) - set(ints)
    if plain:
        raise NoRule(f"cannot differentiate the integral {min(plain, key=sp.default_sort_key)}")
    if not ints:
        return sp.diff(expr, var)
    dummies = [sp.Dummy(f"I{i}") for i in range(len(ints))]
    body = expr.xreplace(dict(zip(ints, dummies)))
    out = sp.diff(body, var)
    for I, dm in zip(ints, dummies):
        out += sp.diff(body, dm) * _d_integral(I, var, pair)
    return out.xreplace(dict(zip(dummies, ints)))
