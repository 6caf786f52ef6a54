"""Numbers from the symbols: evaluate a kernel map in float64 (numpy) or mpmath (dps digits).

Closed forms are evaluated from their SymPy expressions (lambdify). Each unevaluated
GaussianIntegral left in an expression is replaced by a call to the error-controlled Gaussian
quadrature (:mod:`symfield.numeric.quadrature`, pools: :mod:`symfield.numeric.pool.rules`)
of the Integrand it carries.
"""
from __future__ import annotations

from symfield.core.errors import NoRule
import math
import warnings
from functools import lru_cache

import mpmath
import numpy as np
import sympy as sp

from symfield.core import caches, timelimit
from symfield.numeric.pool import rules as pool_rules
from symfield.numeric import quadrature as Q
from symfield.symbolic import gaussian as G
from symfield.symbolic.distance import sin_minus_tcos_mp
from symfield.symbolic.formula import X as x
from symfield.symbolic.integrals import GaussianIntegral, Integrand, Kind, install_quadrature, integrals
from symfield.symbolic.stored import stored

GUARD_DIGITS = 10


REWRITE_SECONDS = 2.0   # budget of SymPy's factoring expm1/log1p rewrite of one integrand
PROBES_NEAR_0 = (1e-12, -1e-12, 1e-7, -1e-7, 1e-3, -1e-3, 0.3, -0.3)


def _cheap_rewrite(f):
    """exp(a) - 1 -> expm1(a) and log(1 + u) -> log1p(u) where they appear as written (no factoring)."""
    from sympy.codegen.cfunctions import log1p
    from sympy.codegen.rewriting import expm1_opt
    f = f.replace(expm1_opt.query, expm1_opt.replace_in_Add)
    return f.replace(lambda e: isinstance(e, sp.log) and e.args[0].is_Add and sp.S.One in e.args[0].args,
                     lambda e: log1p(e.args[0] - 1))


def _digits_lost_near_0(fast, f):
    """The first probe point near 0 where float64 ``fast`` differs from mpmath f by more than 1e-12
    relative (cancellation the rewrite did not remove), else None."""
    exact = sp.lambdify(x, f, modules="mpmath")
    for p in PROBES_NEAR_0:
        try:
            with np.errstate(all="ignore"):
                got = float(fast(np.array([p]))[0])
            with mpmath.workdps(30):
                want = mpmath.mpmathify(exact(mpmath.mpf(p)))
        except (ArithmeticError, ValueError, TypeError):
            continue
        if isinstance(want, mpmath.mpf) and math.isfinite(got) and abs(got - want) > 1e-12 * abs(want):
            return p
    return None


@stored
def _factored_rewrite(f):
    """SymPy's expm1/log1p rewrite (it factors first) under the REWRITE_SECONDS budget (TooExpensive)."""
    from sympy.codegen.rewriting import expm1_opt, log1p_opt, optimize
    return timelimit.bounded("the expm1/log1p rewrite", str(f), optimize, f, [expm1_opt, log1p_opt],
                             seconds=REWRITE_SECONDS)


def _accurate(f, modules):
    """float64 callable of f with exp(x) - 1 -> expm1(x) and log(1 + x) -> log1p(x) (float64 keeps its
    relative digits near 0: elu(x)^2 at x ~ 1e-14 lost them all).  SymPy's rewrite factors the
    expression (exp(-851 x/500) is a polynomial of degree 851 in exp(x/500)): it runs under
    REWRITE_SECONDS, else the rewrite as written is used and checked near 0, with a warning if digits are lost."""
    try:
        return _lambdify(x, _factored_rewrite(f), modules)
    except timelimit.TooExpensive:
        fast = _lambdify(x, _cheap_rewrite(f), modules)
    except Exception:       # a form the rewriter does not take: as given
        return _lambdify(x, f, modules)
    p = _digits_lost_near_0(fast, f)
    if p is not None:
        warnings.warn(f"float64 evaluation of {f} loses digits near x = {p:g} (cancellation not rewritten "
                      f"within {REWRITE_SECONDS:g} s); use dps=N for values near 0.", RuntimeWarning, stacklevel=3)
    return fast


def vectorised(f, modules):
    if modules == "mpmath":
        fn = sp.lambdify(x, f, modules=modules)
        return lambda v: mpmath.mpmathify(fn(v))
    fn = _accurate(f, modules)

    exact = sp.lambdify(x, f, modules="mpmath")

    def call(v):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = np.asarray(fn(v), dtype=float)
        out = np.broadcast_to(out, np.shape(v)).copy() if out.shape != np.shape(v) else out
        bad = ~np.isfinite(out)
        if bad.any():  # overflow in an intermediate (e.g. exp(-x)/(1+exp(-x))^2 at x = -800): redo in mpmath
            out[bad] = [float(mpmath.mpmathify(exact(mpmath.mpf(float(t))))) for t in np.asarray(v)[bad]]
        return out
    return call


def sin_minus_tcos(t):
    """W(t) = sin t - t cos t on float64 arrays: its Taylor series (Horner) for |t| < 0.5, else direct."""
    t = np.asarray(t, dtype=float)
    t2 = t * t
    s = np.zeros_like(t)
    for k in range(12, 0, -1):   # sum_k (-1)^(k+1) 2k t^(2k+1)/(2k+1)!
        s = s * t2 + (-1.0) ** (k + 1) * 2 * k / math.factorial(2 * k + 1)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.abs(t) < 0.5, s * t2 * t, np.sin(t) - t * np.cos(t))


class erfcx(sp.Function):
    """exp(x^2) erfc(x), scaled: finite in float64 where exp(x^2) overflows and erfc(x) underflows."""
    nargs = 1


def _erfcx_f64(v):
    from scipy.special import erfcx as f
    return f(v)


def scaled_erfc(expr):
    """exp(a) erfc(b) -> erfcx(b) exp(a - b^2) in each product (a - b^2 expanded: 0 for elu's maps, where
    exp(2q) erfc(sqrt(2q)) overflowed at q > 354 and every point went to mpmath). Used only where the form
    as derived overflows: where both are finite, the derived form is as accurate or better."""
    def fix(m):
        es = [f for f in m.args if isinstance(f, sp.exp)]
        cs = [f for f in m.args if isinstance(f, sp.erfc)]
        if not es or not cs:
            return m
        a, b = es[0].args[0], cs[0].args[0]
        rest = [f for f in m.args if f is not es[0] and f is not cs[0]]
        return sp.Mul(*rest, erfcx(b), sp.exp(sp.expand(a - b ** 2)))
    return expr.replace(lambda e: isinstance(e, sp.Mul), fix)


NUMPY_MODULES = [{"Heaviside": lambda a, h=0.5: np.heaviside(a, h), "SinMinusTCos": sin_minus_tcos,
                  "erfcx": _erfcx_f64}, "scipy", "numpy"]
MPMATH_MODULES = [{"SinMinusTCos": sin_minus_tcos_mp}, "mpmath"]


def _lambdify(args, expr, modules):
    """sp.lambdify; with "scipy" among ``modules``, SciPy joins only for a function NumPy's printer does not
    know (erf, gamma, Bessel, ...): importing scipy costs ~0.3 s, more than a whole warm phase diagram of tanh."""
    if "scipy" in modules and not _needs_scipy(expr):
        modules = [m for m in modules if m != "scipy"]
    return sp.lambdify(args, expr, modules=modules)


def _needs_scipy(expr) -> bool:
    from sympy.printing.numpy import NumPyPrinter, SciPyPrinter
    names = {type(f).__name__ for f in sp.sympify(expr).atoms(sp.Function)}
    return any((n in SciPyPrinter._kf and n not in NumPyPrinter._kf)
               or (hasattr(SciPyPrinter, "_print_" + n) and not hasattr(NumPyPrinter, "_print_" + n)) for n in names)


_INTEGRANDS: dict = caches.memo()


def _integrand_fn(f, f64):
    """:func:`vectorised` of one factor of an integrand, once per process: the Gram ingredients share factors
    (phi, phi', phi'' at u or v recur in most of the 13 moments and derivatives), and the float64 rewrite of each
    (SymPy's expm1/log1p optimisation) costs ~0.05-0.1 s."""
    key = (f, f64)
    if key not in _INTEGRANDS:
        _INTEGRANDS[key] = vectorised(f, NUMPY_MODULES if f64 else "mpmath")
    return _INTEGRANDS[key]


def integral_rule(spec: Integrand, kinks, dps):
    """The numeric rule of one GaussianIntegral: a callable of (q,) or (q1, q2, q12)."""
    if spec.kind.pooled:
        return pool_rules.pool_impl(spec, kinks, dps, vectorised, NUMPY_MODULES)
    fs = [_integrand_fn(f, dps is None) for f in (spec.f, spec.g) if f is not None]
    if dps is None:
        name = f"({spec.f})" if spec.kind is Kind.NORMAL1 else f"({spec.f})(u) ({spec.g})(v)"
        if spec.kind is Kind.NORMAL1:
            return lambda qv: Q.expect1_vec(fs[0], qv, kinks=kinks, name=name)
        return lambda a, b, c: Q.expect2_vec(fs[0], fs[1], a, b, c, kinks=kinks, name=name)
    if spec.kind is Kind.NORMAL1:
        return lambda qv: Q.expect1(fs[0], qv, kinks=kinks, dps=dps)
    return lambda a, b, c: Q.expect2(fs[0], fs[1], a, b, c, kinks=kinks, dps=dps)


@lru_cache(maxsize=512)
def evaluator(expr: sp.Expr, args: tuple, kinks: tuple = (), dps: int | None = None):
    """A callable of ``args`` evaluating ``expr`` (float64 arrays if dps is None, else mpmath)."""
    impls, repl = {}, {}
    plain = expr.atoms(sp.Integral) - expr.atoms(GaussianIntegral)
    if plain:
        raise NoRule(f"no numeric rule for the integral {min(plain, key=sp.default_sort_key)}")
    for i, I in enumerate(integrals(expr)):
        name = f"_quad{i}"
        impls[name] = integral_rule(I.integrand, kinks, dps)
        repl[I] = sp.Function(name)(*((I.scale(),) if I.integrand.kind.dims == 1 else (G.q1, G.q2, G.q12)))
    body = expr.xreplace(repl)
    if dps is None:
        fn = _lambdify(args, body, [impls] + NUMPY_MODULES)
        scaled = scaled_erfc(body)
        fn2 = _lambdify(args, scaled, [impls] + NUMPY_MODULES) if scaled != body else None

        def run(*vals):
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                out = fn(*vals)
            out = np.broadcast_to(np.asarray(out, dtype=float), np.broadcast(*vals).shape).copy()
            bad = ~np.isfinite(out)
            full = np.broadcast_arrays(*vals)
            if bad.any() and fn2 is not None:   # exp(a) erfc(b) overflowed: the scaled form, still float64
                with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                    out[bad] = np.broadcast_to(fn2(*[np.asarray(a)[bad] for a in full]), (int(bad.sum()),))
                bad = ~np.isfinite(out)
            if bad.any():  # overflow in a float64 intermediate (0*inf, inf/inf): redo those points in mpmath
                exact = evaluator(expr, args, kinks, 30)
                for idx in np.argwhere(bad):
                    idx = tuple(idx)
                    out[idx] = float(exact(*[mpmath.mpf(float(a[idx])) for a in full]))
            return out
        return run
    fn = sp.lambdify(args, body, modules=[impls] + MPMATH_MODULES)

    def run_mp(*vals):
        with mpmath.workdps(dps + GUARD_DIGITS):
            out = mpmath.mpmathify(fn(*[mpmath.mpf(v) if not isinstance(v, mpmath.mpf) else v for v in vals]))
        return +out if not isinstance(out, mpmath.mpc) else out.real
    return run_mp


def _breaks(fns, args, dps):
    """The real, finite values of the breakpoint callables at args (those that fail or are complex dropped)."""
    out = []
    for fn in fns:
        try:
            with np.errstate(all="ignore"):
                v = fn(*args) if dps is not None else complex(fn(*args))
        except (ArithmeticError, ValueError, TypeError):
            continue
        if dps is None:
            if v.imag == 0 and math.isfinite(v.real):
                out.append(v.real)
        elif isinstance(v, (mpmath.mpf, int)) or (isinstance(v, mpmath.mpc) and v.imag == 0):
            v = mpmath.mpf(mpmath.re(v))
            if mpmath.isfinite(v):
                out.append(v)
    return out


def _at(fn, p, dps, *fixed):
    """z -> fn(*fixed, z, *p); in float64 every argument is broadcast to z's shape (a Piecewise with
    constant pieces, printed as numpy.select, needs equal shapes)."""
    if dps is not None:
        return lambda z: fn(*fixed, z, *p)
    return lambda z: fn(*[np.full(np.shape(z), a, dtype=float) for a in fixed], z,
                        *[np.full(np.shape(z), a, dtype=float) for a in p])


def _standard_expectation(form, parts, p, dps):
    """One parameter point p of a symbolic.integrals.QuadraturePlan (forms line, plane, pair)."""
    if form == "line":
        body, points = parts
        return Q.expect1(_at(body, p, dps), 1, kinks=_breaks(points, p, dps), dps=dps, name="integrand")
    if form == "pair":
        A, B, alpha, beta, points = (parts[0], parts[1]) + tuple(f(*p) for f in parts[2:4]) + (parts[4],)
        return Q.expect2(_at(A, p, dps), _at(B, p, dps), 1, alpha * alpha + beta * beta, alpha,
                         kinks=_breaks(points, p, dps), dps=dps, name="integrand")
    body, points, roots = parts

    def inner(w):
        return Q.expect1(_at(body, p, dps, w), 1, kinks=_breaks(roots, (w, *p), dps), dps=dps,
                         name="inner integrand")
    outer = inner if dps is not None else (lambda ws: np.array([inner(w) for w in np.ravel(ws)]))
    return Q.expect1(outer, 1, kinks=_breaks(points, p, dps), dps=dps, name="outer integrand")


def standard_expectation(form, parts, params, dps):
    """The rule GaussianIntegral evaluates itself with (symbolic.integrals.install_quadrature): float64
    over broadcast parameter arrays (dps None; a float for scalars), else an mpf good to dps digits."""
    if dps is not None:
        with mpmath.workdps(dps + Q.GUARD):
            return _standard_expectation(form, parts, [to_mpf(v) for v in params], dps)
    if not params:
        return _standard_expectation(form, parts, (), None)
    out = Q.elementwise(lambda *p: _standard_expectation(form, parts, p, None), params, None)
    return float(out) if out.ndim == 0 else out


install_quadrature(standard_expectation)


def evaluate(expr, args, values, kinks=(), dps=None):
    """Evaluate ``expr`` at ``values`` (broadcast arrays, or mpmath element-wise when dps is set)."""
    fn = evaluator(sp.sympify(expr), tuple(args), tuple(kinks), dps)
    if dps is None:
        return fn(*[np.asarray(v, dtype=float) for v in values])
    arrays = np.broadcast_arrays(*[np.asarray(v, dtype=object) for v in values])
    if arrays[0].ndim == 0:
        with mpmath.workdps(dps + GUARD_DIGITS):
            return _round(fn(*[to_mpf(a.item()) for a in arrays]), dps)
    out = np.empty(arrays[0].shape, dtype=object)
    with mpmath.workdps(dps + GUARD_DIGITS):
        for idx in np.ndindex(out.shape):
            out[idx] = _round(fn(*[to_mpf(a[idx]) for a in arrays]), dps)
    return out


def to_mpf(v):
    """mpf of a number; python/numpy floats are read as the decimal they print as (0.1 -> mpf('0.1'))."""
    if isinstance(v, mpmath.mpf):
        return v
    if isinstance(v, (float, np.floating)):
        return mpmath.mpf(repr(float(v)))
    return mpmath.mpmathify(v)


def _round(v, dps):
    with mpmath.workdps(dps):
        return +v
