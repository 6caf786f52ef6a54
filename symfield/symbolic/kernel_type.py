"""The Kernel record: the symbolic maps of one activation (see kernel.py for how they are derived)."""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from symfield.symbolic.activation import Activation
from symfield.symbolic.gaussian import q, q1, q2

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

    def __getitem__(self, name):
        return getattr(self, name)

    def describe(self) -> str:
        lines = [f"kernel of {self.act.name}: {'closed form' if self.closed_form else 'no closed form found for every map'}"]
        for name in MAPS:
            lines.append(f"  {name:6s} [{self.methods[name]}]: {self[name]}")
        return "\n".join(lines)
