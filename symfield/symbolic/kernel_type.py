"""The Kernel record: the symbolic maps of one activation (see kernel.py for how they are derived)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import sympy as sp

from symfield.symbolic.activation import Activation
from symfield.symbolic.formula import X as x
from symfield.symbolic.gaussian import homogeneous, q, q1, q2
from symfield.symbolic.stored import stored

MAPS = ("V", "C", "mean", "dpsi2", "dC", "dV")


@dataclass(frozen=True)
class Kernel:
    """Symbolic maps of one activation; ``methods`` names how each was obtained."""
    act: Activation
    V: sp.Expr
    C: sp.Expr
    mean: sp.Expr
    dpsi2: sp.Expr
    dC: sp.Expr
    dV: sp.Expr
    methods: dict = field(compare=False)
    kinks: tuple = ()
    base: "Kernel | None" = field(default=None, compare=False, repr=False)

    @property
    def closed_form(self) -> bool:
        """True when V and C are free of unevaluated integrals."""
        return not (self.V.has(sp.Integral) or self.C.has(sp.Integral))

    @property
    def C0(self) -> sp.Expr:
        """Exact special case c = 0: C(q1, q2, 0) = E[psi](q1) E[psi](q2)."""
        return self.mean.subs(q, q1) * self.mean.subs(q, q2)

    # ---- facts about psi, each worked out once per kernel (docs/numerics.md section 1)
    @cached_property
    def phi(self) -> sp.Expr:
        """The single-node activation phi (psi = phi, or a pool of phi over k nodes)."""
        return self.act.expr

    @cached_property
    def homogeneity(self) -> tuple | None:
        """(n, a, b) with phi(x) = b x^n for x > 0 and a x^n for x < 0 (then psi(t u) = t^n psi(u), t > 0), else None."""
        return homogeneous(self.phi)

    @cached_property
    def degree(self) -> int | None:
        """n >= 1 when psi is positively homogeneous of degree n (V = V(1) q^n, C = (q1 q2)^(n/2) g(theta)), else None."""
        h = self.homogeneity
        return int(h[0]) if h is not None and h[0] >= 1 else None

    @cached_property
    def degree_one(self) -> bool:
        """psi positively homogeneous of degree 1: V/q, C/q and E[psi'^2] do not depend on q (relu family)."""
        return self.degree == 1

    @cached_property
    def parity(self) -> int:
        """2 if psi is even, 1 if odd (odd phi, single node or avg-pool), else 0."""
        return _parity(self.phi, self.act.pool, self.act.k)

    @cached_property
    def psi0(self) -> float:
        """psi(0) = phi(0) (float64)."""
        return float(sp.N(self.phi.subs(x, 0), 30))

    @cached_property
    def jumps(self) -> bool:
        """phi jumps (psi' has a point mass): E[psi'^2] is infinite."""
        return self.dpsi2 == sp.oo

    @cached_property
    def zero_at_zero(self) -> bool:
        """V(0+) = 0: q = 0 solves the variance fixed-point equation at sigma_b2 = 0. The limit of a closed-form
        V; for an integral, psi(0) = 0 with phi continuous (no jump), so V(0+) = psi(0)^2 = 0."""
        if not self.V.has(sp.Integral):
            return limit_at_0(self.V) == 0
        return self.psi0 == 0.0 and not self.jumps

    @cached_property
    def chi1_constant(self) -> bool:
        """V(q)/E[psi'^2](q) = q exactly (closed forms): chi1 does not depend on q."""
        return not self.V.has(sp.Integral) and sp.simplify(self.V / self.dpsi2 - q) == 0

    def __getitem__(self, name):
        return getattr(self, name)

    def describe(self) -> str:
        lines = [f"kernel of {self.act.name}: {'closed form' if self.closed_form else 'no closed form found for every map'}"]
        for name in MAPS:
            lines.append(f"  {name:6s} [{self.methods[name]}]: {self[name]}")
        return "\n".join(lines)


@stored
def _parity(phi, pool, k) -> int:
    if sp.simplify(phi.subs(x, -x) - phi) == 0:
        return 2
    odd = sp.simplify(phi.subs(x, -x) + phi) == 0
    return 1 if odd and (pool in (None, "avg") or k == 1) else 0


@stored
def limit_at_0(expr) -> sp.Expr:
    """lim expr as q -> 0+ (SymPy)."""
    return sp.limit(expr, q, 0, "+")
