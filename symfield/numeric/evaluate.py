"""Numbers from the symbols: evaluate a kernel map in float64 (numpy) or mpmath (dps digits).

Closed forms are evaluated from their SymPy expressions (lambdify). Each unevaluated
GaussianIntegral left in an expression is replaced by a call to the error-controlled Gaussian
quadrature (:mod:`symfield.numeric.quadrature`, pools: :mod:`symfield.numeric.pool_rules`)
of the Integrand it carries.
"""
from __future__ import annotations

import math
from functools import lru_cache

import mpmath
import numpy as np
import sympy as sp

from symfield.numeric import pool_rules
from symfield.numeric import quadrature as Q
from symfield.symbolic import gaussian as G
from symfield.symbolic.distance import sin_minus_tcos_mp
from symfield.symbolic.formula import X as x
from symfield.symbolic.integrals import GaussianIntegral, Integrand, Kind, integrals

GUARD_DIGITS = 10


def _accurate(f):
    """f with exp(x) - 1 -> expm1(x) and log(1 + x) -> log1p(x) (float64 keeps its relative digits near 0:
    elu(x)^2 at x ~ 1e-14 lost them all)."""
    from sympy.codegen.rewriting import expm1_opt, log1p_opt, optimize
    try:
        return optimize(f, [expm1_opt, log1p_opt])
    except Exception:       # a form the rewriter does not take: as given
        return f


def vectorised(f, modules):
    if modules == "mpmath":
        fn = sp.lambdify(x, f, modules=modules)
        return lambda v: mpmath.mpmathify(fn(v))
    fn = sp.lambdify(x, _accurate(f), modules=modules)

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


NUMPY_MODULES = [{"Heaviside": lambda a, h=0.5: np.heaviside(a, h), "SinMinusTCos": sin_minus_tcos},
                 "scipy", "numpy"]
MPMATH_MODULES = [{"SinMinusTCos": sin_minus_tcos_mp}, "mpmath"]


def integral_rule(spec: Integrand, kinks, dps):
    """The numeric rule of one GaussianIntegral: a callable of (q,) or (q1, q2, q12)."""
    if spec.kind.pooled:
        return pool_rules.pool_impl(spec, kinks, dps, vectorised, NUMPY_MODULES)
    modules = NUMPY_MODULES if dps is None else "mpmath"
    fs = [vectorised(f, modules) for f in (spec.f, spec.g) if f is not None]
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
        raise NotImplementedError(f"no numeric rule for the integral {min(plain, key=sp.default_sort_key)}")
    for i, I in enumerate(integrals(expr)):
        name = f"_quad{i}"
        impls[name] = integral_rule(I.integrand, kinks, dps)
        repl[I] = sp.Function(name)(*((I.scale(),) if I.integrand.kind.dims == 1 else (G.q1, G.q2, G.q12)))
    body = expr.xreplace(repl)
    if dps is None:
        fn = sp.lambdify(args, body, modules=[impls] + NUMPY_MODULES)

        def run(*vals):
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                out = fn(*vals)
            out = np.broadcast_to(np.asarray(out, dtype=float), np.broadcast(*vals).shape).copy()
            bad = ~np.isfinite(out)
            if bad.any():  # overflow in a float64 intermediate (0*inf, inf/inf): redo those points in mpmath
                exact = evaluator(expr, args, kinks, 30)
                full = np.broadcast_arrays(*vals)
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
