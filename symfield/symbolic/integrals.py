"""Unevaluated Gaussian integrals that say what they compute.

Where no closed form exists a kernel map keeps its defining integral, a :class:`GaussianIntegral`: a
``sympy.Integral`` (it prints, compares and substitutes as one) that also carries an :class:`Integrand`
-- the x-space functions and the law they are integrated against -- so that the numeric layer, the LaTeX
report and the finite-width code read its meaning from the object itself. :class:`Kind` names the laws:
one normal (NORMAL1), a normal pair (NORMAL2), the maximum of k normals (MAX1), the pair of maxima h_k
and its argmax term (MAX2, ARGMAX2), and the argmax node of a non-monotone phi (LEVEL1, LEVEL2;
docs/theory.md section 4).

``N``/``evalf``/``float`` and ``lambdify`` evaluate the defining integral by the error-controlled
quadrature the numeric layer installs (:func:`install_quadrature`, done by ``import symfield``), split at
the kinks (:func:`~symfield.symbolic.activation.kink_args`). evalf gives the requested digits or leaves
the integral unevaluated; lambdified code raises instead. Kinds whose integrand holds an undefined
density (MAX2, ARGMAX2, LEVEL1, LEVEL2) stay unevaluated. ``srepr`` round-trips.
"""
from __future__ import annotations

from symfield.core.errors import Unsupported
import enum
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.printing.precedence import PRECEDENCE_TRADITIONAL

from symfield.symbolic.activation import kink_args


class Kind(enum.Enum):
    NORMAL1 = "normal1"
    NORMAL2 = "normal2"
    MAX1 = "max1"
    MAX2 = "max2"
    ARGMAX2 = "argmax2"
    LEVEL1 = "level1"
    LEVEL2 = "level2"

    @property
    def dims(self) -> int:
        """1 for maps of q, 2 for maps of (q1, q2, q12)."""
        return 1 if self in (Kind.NORMAL1, Kind.MAX1, Kind.LEVEL1) else 2

    @property
    def pooled(self) -> bool:
        return self not in (Kind.NORMAL1, Kind.NORMAL2)


@dataclass(frozen=True)
class Integrand:
    """What a GaussianIntegral integrates: f (and g) in x, over k nodes, phi for level sets."""
    kind: Kind
    f: sp.Expr
    g: sp.Expr | None = None
    k: int = 1
    phi: sp.Expr | None = None
    argmax_only: bool = False


class _Rebuild:
    """``func`` of a GaussianIntegral: rebuilds one with the same Integrand (sympy calls func(*args))."""
    __name__ = "Integral"

    def __init__(self, integrand):
        self.integrand = integrand

    def __call__(self, *args, **kwargs):
        return GaussianIntegral(*args, integrand=self.integrand, **kwargs)


def normal_pdf(w):
    """The standard normal density n(w) = e^(-w^2/2)/sqrt(2 pi)."""
    return sp.exp(-w**2 / 2) / sp.sqrt(2 * sp.pi)


class GaussianIntegral(sp.Integral):
    """A sympy Integral with its :class:`Integrand` attached (survives subs, xreplace, pickling, srepr)."""
    Integrand = Integrand
    Kind = Kind

    def __new__(cls, function, *symbols, integrand: Integrand, **assumptions):
        obj = super().__new__(cls, function, *symbols, **assumptions)
        if isinstance(obj, GaussianIntegral):
            obj._integrand = integrand
        return obj

    @property
    def integrand(self) -> Integrand:
        return self._integrand

    @property
    def func(self):
        return _Rebuild(self._integrand)

    def __reduce_ex__(self, protocol):
        return _rebuild, (self.args, self._integrand)

    def _eval_derivative(self, sym):
        # differentiating under the integral would leave the attached integrand stale
        raise Unsupported("a GaussianIntegral is differentiated through its Integrand (e.g. the scale "
                                  "identity dI/dq = E[x f'(x)]/(2q)), not by sympy.diff")

    def scale(self):
        """The scale symbol of a 1-D integral (q, or the q1/q2 it was renamed to)."""
        (s,) = self.free_symbols
        return s

    def _eval_is_extended_real(self):
        return True   # an expectation of real functions (a divergent one is refused before it is built)

    def _eval_evalf(self, prec):
        """The value to prec bits (a Float), or None (unevaluated) when it has free symbols, holds an
        undefined density, no quadrature is installed or the quadrature cannot confirm the digits."""
        plan = quadrature_plan(self)
        if plan is None or plan.params or "rule" not in _QUADRATURE:
            return None
        dps = max(1, mpmath.libmp.prec_to_dps(prec))
        try:
            v = expectation(plan.form, _mp_parts(plan), (), dps)
        except (ArithmeticError, ValueError, TypeError):   # not confirmed, overflow, a complex value
            return None
        return sp.Float(v, precision=prec)

    def _mpmathcode(self, printer):
        return _code(self, printer, printer, "None")

    def _numpycode(self, printer):
        from sympy.printing.numpy import SciPyPrinter   # erf & co. in the body: scipy.special
        sub = printer if isinstance(printer, SciPyPrinter) else SciPyPrinter(printer._settings)
        out = _code(self, printer, sub, "'float64'")
        for mod, names in sub.module_imports.items():
            printer.module_imports[mod].update(names)
        return out

    def _sympyrepr(self, printer):
        """GaussianIntegral(function, limits, integrand=...): eval'd with sympy's names and this class."""
        spec = self._integrand

        def show(v):
            return printer._print(v) if isinstance(v, sp.Basic) else repr(v)
        parts = [f"GaussianIntegral.Kind({spec.kind.value!r})"]
        parts += [f"{name}={show(getattr(spec, name))}" for name in ("f", "g", "k", "phi", "argmax_only")]
        return (f"GaussianIntegral({', '.join(printer._print(a) for a in self.args)}, "
                f"integrand=GaussianIntegral.Integrand({', '.join(parts)}))")


def _rebuild(args, integrand):
    return GaussianIntegral(*args, integrand=integrand)


def integrals(expr) -> list:
    """The GaussianIntegrals in expr, in a deterministic order."""
    return sorted(expr.atoms(GaussianIntegral), key=sp.default_sort_key)


@lru_cache(maxsize=256)
def kinds(expr) -> frozenset:
    """The Kinds of the GaussianIntegrals in expr (empty for a closed form; memoised: a scalar sf.C asks per call)."""
    return frozenset(I.integrand.kind for I in expr.atoms(GaussianIntegral))


# ---------------------------------------------------------------- numbers (evalf, lambdify)
_QUADRATURE = {}   # "rule": installed by the numeric layer (symfield.numeric.evaluate)
_T = sp.Dummy("t", real=True)


def install_quadrature(rule):
    """Install ``rule(form, parts, params, dps)``, the quadrature of a :class:`QuadraturePlan` (its parts as
    callables of their variables and then the params): float64 (dps None, params broadcast) or mpmath
    to dps digits.  The numeric layer calls this on import (the symbolic layer cannot import it)."""
    _QUADRATURE["rule"] = rule


def expectation(form, parts, params, dps):
    """The installed rule (what lambdified GaussianIntegrals call); dps "float64": float64, None: mpmath
    at the caller's mp.dps (rounded to it), else mpmath to dps digits."""
    rule = _QUADRATURE.get("rule")
    if rule is None:
        raise Unsupported("a GaussianIntegral is evaluated by the numeric layer's quadrature: "
                                  "import symfield (or symfield.numeric.evaluate) first")
    if dps == "float64":
        return rule(form, parts, params, None)
    if dps is None:
        return +rule(form, parts, [mpmath.mpmathify(p) for p in params], mpmath.mp.dps)
    return rule(form, parts, params, dps)


# LaTeX and pretty printers look precedence up by class name: a GaussianIntegral binds like the Integral it is
# (so E[psi]^2 prints as (int Dz psi)^2, not int Dz psi^2)
PRECEDENCE_TRADITIONAL[GaussianIntegral.__name__] = PRECEDENCE_TRADITIONAL["Integral"]


@dataclass(frozen=True)
class QuadraturePlan:
    """A GaussianIntegral as an expectation over i.i.d. standard normals, in one of three forms:

    ``line``   E[body(z)], breakpoints ``points``;
    ``plane``  E[body(z1, z2)], outer z1 with breakpoints ``points``, inner z2 with kinks ``roots(z1)``;
    ``pair``   E[A(z1) B(alpha z1 + beta z2)] = E[A(u) B(v)], (u, v) ~ N(0, [[1, alpha], [alpha,
               alpha^2 + beta^2]]), breakpoints ``points`` (of A and B, in their argument units).

    ``parts``: (variables, expression or tuple of expressions); every part is also a function of ``params``
    (the integral's free symbols)."""
    form: str
    parts: tuple
    params: tuple


def _zeros_in(a, var):
    """Roots of a in var (expressions) when a is a polynomial of degree 1 or 2 in var, else ()."""
    a = sp.expand(a)
    if not a.has(var) or not a.is_polynomial(var):
        return ()
    poly = sp.Poly(a, var)
    return tuple(sp.roots(poly)) if 1 <= poly.degree() <= 2 else ()


def _kinks_of(expr, var):
    return {r for a in kink_args(expr) for r in _zeros_in(a, var)}


def _sorted(exprs):
    return tuple(sorted(exprs, key=sp.default_sort_key))


def _pair(body, z1, z2):
    """(A(z1), B(t), alpha, beta) with body = A(z1) B(alpha z1 + beta z2), else None."""
    A = sp.Mul(*[a for a in sp.Mul.make_args(body) if not a.has(z2)])
    R = sp.Mul(*[a for a in sp.Mul.make_args(body) if a.has(z2)])
    for e in sp.preorder_traversal(R):
        if isinstance(e, sp.Expr) and e.has(z1) and e.has(z2) and e.is_polynomial(z1, z2) \
                and sp.Poly(e, z1, z2).total_degree() == 1:
            lin = sp.expand(e)
            alpha, beta = lin.coeff(z1), lin.coeff(z2)
            B = R.xreplace({e: _T + (lin - alpha * z1 - beta * z2)})
            if B.has(z1, z2):   # the combination also appears distributed (851/500 v, expanded)
                B = sp.expand(R.subs(z2, (_T - alpha * z1) / beta), power_base=False, power_exp=False,
                              log=False, multinomial=False)
            return (A, B, alpha, beta) if not B.has(z1, z2) else None
    return None


def _plane(body, z1, z2, I):
    """The ``plane`` plan: kinks of the inner variable z2 as functions of z1; the outer breakpoints are the
    kinks free of z2, where each kink line meets z2 = 0 and where two inner kinks cross."""
    points, roots = set(), set()
    for a in kink_args(I.function):
        here = _zeros_in(a, z2)
        roots.update(here)
        points.update(_zeros_in(a.subs(z2, 0) if here else a, z1))
    rs = _sorted(roots)
    for i, r in enumerate(rs):
        for t in rs[i + 1:]:
            points.update(_zeros_in(sp.numer(sp.together(r - t)), z1))
    return "plane", (((z1, z2), body), ((), _sorted(points)), ((z1,), rs))


def _over_density(f, zs):
    """f / prod n(z), the Gaussian factors cancelled (inside each piece of a Piecewise too)."""
    body = sp.piecewise_fold(f / sp.Mul(*[normal_pdf(w) for w in zs]))
    if isinstance(body, sp.Piecewise):
        return sp.Piecewise(*[(sp.powsimp(e), c) for e, c in body.args])
    return sp.powsimp(body)


@lru_cache(maxsize=256)
def quadrature_plan(I):
    """The :class:`QuadraturePlan` of a GaussianIntegral over the whole line (plane), else None
    (finite limits, more than 2 variables, an undefined function in the integrand)."""
    if not 1 <= len(I.limits) <= 2 or any(len(L) != 3 or L[1] != -sp.oo or L[2] != sp.oo for L in I.limits) \
            or I.function.atoms(AppliedUndef):
        return None
    zs = tuple(L[0] for L in I.limits)
    body = _over_density(I.function, zs)
    params = tuple(sorted(I.free_symbols, key=sp.default_sort_key))
    if len(zs) == 1:
        return QuadraturePlan("line", ((zs, body), ((), _sorted(_kinks_of(I.function, zs[0])))), params)
    split = _pair(body, *zs)
    if split is None:
        return QuadraturePlan(*_plane(body, *zs, I), params)
    A, B, alpha, beta = split
    points = _sorted(_kinks_of(A, zs[0]) | _kinks_of(B, _T))
    return QuadraturePlan("pair", ((zs[:1], A), ((_T,), B), ((), alpha), ((), beta), ((), points)), params)


@lru_cache(maxsize=256)
def _mp_parts(plan):
    """The parts of a plan as mpmath callables."""
    def fn(names, e):
        return sp.lambdify(names + plan.params, e, modules="mpmath")
    return tuple(tuple(fn(v, x) for x in e) if isinstance(e, tuple) else fn(v, e) for v, e in plan.parts)


def _code(I, printer, sub, dps):
    """Code calling :func:`expectation` for I (printer: the lambdify printer, sub: prints the expressions)."""
    plan = quadrature_plan(I)
    if plan is None:
        return printer._print_Integral(I)
    ps = [sub._print(p) for p in plan.params]

    def lam(names, e):
        return f"(lambda {', '.join([sub._print(n) for n in names] + ps)}: {sub._print(e)})"
    parts = [("(" + "".join(lam(v, x) + ", " for x in e) + ")") if isinstance(e, tuple) else lam(v, e)
             for v, e in plan.parts]
    fn = printer._module_format("symfield.symbolic.integrals.expectation")
    return f"{fn}({plan.form!r}, ({', '.join(parts)}, ), ({''.join(p + ', ' for p in ps)}), {dps})"
