"""Unevaluated Gaussian integrals that say what they compute.

Where no closed form exists a kernel map keeps its defining integral. Each such integral is a
:class:`GaussianIntegral`: a ``sympy.Integral`` (it prints, compares and substitutes as one)
that also carries an :class:`Integrand` -- the x-space functions and the law they are integrated
against -- so that the numeric layer, the LaTeX report and the finite-width code read its meaning
from the object itself:

    Kind.NORMAL1   E[f(u)],           u ~ N(0, q)
    Kind.NORMAL2   E[f(u) g(v)],      (u, v) ~ N(0, [[q1, q12], [q12, q2]])
    Kind.MAX1      E[f(sqrt(q) M_k)], M_k the maximum of k standard normals (density k n Phi^(k-1))
    Kind.MAX2      E[f(sqrt(q1) S) g(sqrt(q2) T)] against h_k, the density of the two maxima
    Kind.ARGMAX2   the same against the argmax term k F^(k-1) rho_c of h_k (Price's theorem)
    Kind.LEVEL1    E[f(u_A)], u_A the argmax node of phi over k nodes (phi not monotone)
    Kind.LEVEL2    E[f(u_A) g(v_B)] against the argmax-pair density (argmax_only: its A = B part)

A 1-D integral is a function of one scale symbol (q, or q1/q2 after substitution); it is read
off the integral's free symbols.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import sympy as sp


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


class GaussianIntegral(sp.Integral):
    """A sympy Integral with its :class:`Integrand` attached (survives subs, xreplace, pickling)."""

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
        raise NotImplementedError("a GaussianIntegral is differentiated through its Integrand (e.g. the scale "
                                  "identity dI/dq = E[x f'(x)]/(2q)), not by sympy.diff")

    def scale(self):
        """The scale symbol of a 1-D integral (q, or the q1/q2 it was renamed to)."""
        (s,) = self.free_symbols
        return s


def _rebuild(args, integrand):
    return GaussianIntegral(*args, integrand=integrand)


def integrals(expr) -> list:
    """The GaussianIntegrals in expr, in a deterministic order."""
    return sorted(expr.atoms(GaussianIntegral), key=sp.default_sort_key)


def kinds(expr) -> set:
    """The Kinds of the GaussianIntegrals in expr (empty for a closed form)."""
    return {I.integrand.kind for I in expr.atoms(GaussianIntegral)}
