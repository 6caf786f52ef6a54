"""V and the mean of phi(0) = 0 activations at small q, without cancellation (docs/numerics.md section 8).

Closed forms such as elu's V(q) = q/2 - e^(q/2) erfc(sqrt(q/2)) + e^(2q) erfc(sqrt(2q))/2 + 1/2, or sin's
(1 - e^(-2q))/2, add O(1) terms that cancel to O(q): float64 loses about log10(1/q) digits (elu: 8e-5
relative at q = 1e-12). Below Q_SMALL the engine takes the defining integrals in the scaled variable z:

    V(q) = E[phi(sqrt(q) Z)^2],   mean(q) = E[phi(sqrt(q) Z)],   Z ~ N(0, 1),

by a fixed Gauss-Legendre rule on unit panels of z in [0, Z_WINDOW], folded (phi(x) and phi(-x)), with phi
in its accurate float64 form (expm1, log1p), for each map whose closed form loses more digits than the
rule. Single-node kernels only, and only when every kink other than 0 lies outside the window at Q_SMALL,
so the integrand is smooth on each panel.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import sympy as sp

from symfield.numeric.evaluate import NUMPY_MODULES, evaluate, vectorised
from symfield.symbolic.gaussian import q as Q

Q_SMALL = 0.1        # V and the mean use the scaled rule below this q
Z_WINDOW = 12.0      # z in [-Z_WINDOW, Z_WINDOW]: the Gaussian tail beyond is below 1e-31
MAPS = ("V", "mean")
_T, _W = np.polynomial.legendre.leggauss(16)


def _rule():
    cuts = np.arange(0.0, Z_WINDOW + 0.5, 1.0)                # unit panels on z > 0 (the rule is folded)
    half, mid = (cuts[1:] - cuts[:-1]) / 2, (cuts[1:] + cuts[:-1]) / 2
    z = (mid[:, None] + half[:, None] * _T).ravel()
    w = (half[:, None] * _W).ravel() * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    return z, w


class SmallQ:
    """V(q) and mean(q) on float64 arrays of 0 < q < Q_SMALL; ``names``: the maps it serves (those whose
    closed form is the worse of the two at small q)."""

    def __init__(self, phi, names=MAPS):
        self.phi, self.names = vectorised(phi, NUMPY_MODULES), names
        self.z, self.w = _rule()

    def __call__(self, name, q):
        """Folded on z > 0: phi(x) + phi(-x) (an odd phi gives exactly 0), phi(x)^2 + phi(-x)^2."""
        q = np.asarray(q, float)
        x = np.sqrt(q).reshape(-1, 1) * self.z[None, :]
        a, b = self.phi(x), self.phi(-x)
        vals = a * a + b * b if name == "V" else a + b
        return (vals @ self.w).reshape(q.shape)


def small_q(K) -> SmallQ | None:
    """The small-q rule of kernel K, or None where it does not apply (pools, phi(0) != 0, kinks near 0) or
    is not needed (closed forms that keep their digits, integrals)."""
    if K.act.pool is not None and K.act.k > 1:
        return None
    if K.psi0 != 0 or any(k != 0 and abs(k) <= Z_WINDOW * math.sqrt(Q_SMALL) for k in K.kinks):
        return None
    closed = [n for n in MAPS if not K[n].has(sp.Integral)]   # integrals keep their tables or quadrature
    if not closed:
        return None
    rule = SmallQ(K.phi)
    rule.names = tuple(n for n in closed if _worse(K, n, rule))
    return rule if rule.names else None


def _worse(K, name, rule, qs=(1e-12, 1e-8, 1e-4)):
    """The closed form of ``name`` loses more digits than the rule at some q of ``qs`` (both against its
    40-digit value)."""
    expr = K[name]
    for q in qs:
        try:
            with mpmath.workdps(40):
                ref = evaluate(expr, (Q,), (mpmath.mpf(q),), (), 40)
            closed = float(evaluate(expr, (Q,), (q,)))
        except (ArithmeticError, TypeError, ValueError):     # no comparison: the closed form stays
            return False
        if abs(closed - ref) > max(abs(float(rule(name, q)) - ref), 1e-15 * abs(ref)):
            return True
    return False
