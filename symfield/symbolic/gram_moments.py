"""The two-input Gaussian integrals of the finite-width Gram theory, as SymPy expressions.

With (u, v) ~ N(0, [[q1, q12], [q12, q2]]) and psi the activation (or its pool over k nodes):

    C(q1, q2, q12) = E[psi(u) psi(v)],    m_ij = E[psi(u)^i psi(v)^j]  (i + j = 4)

and the derivatives of C in (q1, q2, q12) by the rules of :mod:`symfield.symbolic.derivatives` (Price's
theorem and the scale identity; the derivative integrals stay integrals). Max-pool pairs have no such
rule: ``grad`` and ``hess`` are then None and the caller differentiates numerically.
"""
from __future__ import annotations

from symfield.core.errors import Unsupported
from dataclasses import dataclass, field
from functools import lru_cache
import sympy as sp
from sympy.utilities.iterables import multiset_partitions

from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation, is_monotone
from symfield.symbolic.derivatives import d
from symfield.symbolic.kernel import kernel
from symfield.symbolic.pool import max_expect1, max_integral2

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12
VARS = (q1, q2, q12)


@dataclass(frozen=True)
class GramMoments:
    """C, its gradient and Hessian in (q1, q2, q12) (None where not symbolic), and the fourth moments."""
    C: sp.Expr
    grad: tuple | None
    hess: tuple | None           # ((d11, d12, d1c), (d12, d22, d2c), (d1c, d2c, dcc))
    m40: sp.Expr                 # E[psi(u)^4] in q1 (m04 is it with q1 -> q2)
    m22: sp.Expr
    m31: sp.Expr
    m13: sp.Expr
    k: int
    methods: dict = field(compare=False)

    @property
    def closed_form(self) -> bool:
        return not any(e.has(sp.Integral) for e in (self.C, self.m40, self.m22, self.m31, self.m13))


# ---------------------------------------------------------------- mixed moments
def _pair(f, g):
    e = G.expect2(f, g)
    return e.value, e.method


def _one(f, k=1, pool=None):
    """E[f(psi)] at variance q1 for one input."""
    if pool == "max" and k > 1:
        val, how = max_expect1(f, k)
    else:
        e = G.expect1(f)
        val, how = e.value, e.method
    return val.subs(q, q1), how


@lru_cache(maxsize=1)
def _avg_formula():
    """E[(mean of k i.i.d. X_m)^i (mean of Y_m)^j] for i + j <= 4 from the raw moments r_ab = E[X^a Y^b].

    Expand (sum_m X_m)^i (sum_m Y_m)^j over index tuples and group them by which factors share an index:
    each set partition P of the i + j factors occurs for k (k - 1) ... (k - |P| + 1) tuples, with
    expectation prod_(blocks B) r_(a_B b_B) (a_B X's and b_B Y's in B, independence across indices):

        E[Xbar^i Ybar^j] = k^-(i+j) sum_P k!/(k - |P|)! prod_B r_(a_B b_B)     (15 partitions at i + j = 4).
    """
    kk = sp.Symbol("k", positive=True)
    raw = {(a, b): sp.Symbol(f"r{a}{b}") for a in range(5) for b in range(5) if 0 < a + b <= 4}
    out = {(0, 0): sp.Integer(1)}
    for a in range(5):
        for b in range(5 - a):
            if a + b == 0:
                continue
            total = sp.Integer(0)
            for part in multiset_partitions(list(range(a + b))):
                term = sp.ff(kk, len(part))
                for block in part:
                    nx = sum(1 for e in block if e < a)
                    term *= raw[(nx, len(block) - nx)]
                total += term
            out[(a, b)] = sp.expand(total / kk ** (a + b))
    return out, raw, kk


def _avg_moment(phi, k, i, j):
    formula, raw, kk = _avg_formula()
    vals = {}
    for (a, b), sym in raw.items():
        if b == 0:
            vals[sym] = _one(phi**a)[0]
        elif a == 0:
            vals[sym] = _one(phi**b)[0].subs(q1, q2)
        else:
            vals[sym] = _pair(phi**a, phi**b)[0]
    return formula[(i, j)].subs(kk, k).xreplace(vals), "avg-pool cumulants of k i.i.d. nodes"


def moment(act: Activation, i: int, j: int):
    """(E[psi(u)^i psi(v)^j], method) for i, j >= 1."""
    phi = act.expr
    if act.pool is None or act.k == 1:
        return _pair(phi**i, phi**j)
    if act.pool == "max":
        if not is_monotone(phi):
            raise Unsupported(f"the Gram theory supports max-pools of monotone non-decreasing phi only "
                                      f"(psi = phi(max_j u_j)); {act.single.name} is not monotone.")
        return max_integral2(phi**i, phi**j, act.k), "integral (order statistic h_k)"
    return _avg_moment(phi, act.k, i, j)


def moment4(act: Activation):
    """(E[psi(u)^4] in q1, method)."""
    phi = act.expr
    if act.pool is None or act.k == 1:
        return _one(phi**4)
    if act.pool == "max":
        return _one(phi**4, act.k, "max")
    return _avg_moment(phi, act.k, 4, 0)


# ---------------------------------------------------------------- derivatives in (q1, q2, q12)
def _derivatives(C):
    try:
        grad = tuple(d(C, v) for v in VARS)
        hess = tuple(tuple(d(grad[i], VARS[j]) for j in range(3)) for i in range(3))
    except Unsupported:
        return None, None
    return grad, hess


@lru_cache(maxsize=64)
def gram_moments(act) -> GramMoments:
    """The symbolic ingredients of the two-input finite-width recursion for ``act`` (cached)."""
    act = activation(act) if not isinstance(act, Activation) else act
    K = kernel(act)
    grad, hess = _derivatives(K.C)
    m40, how4 = moment4(act)
    m22, how22 = moment(act, 2, 2)
    m31, how31 = moment(act, 3, 1)
    m13, _ = moment(act, 1, 3)
    k = act.k if act.pool is not None else 1
    return GramMoments(C=K.C, grad=grad, hess=hess, m40=m40, m22=m22, m31=m31, m13=m13, k=k,
                       methods={"C": K.methods["C"], "m4": how4, "m22": how22, "m31": how31,
                                "derivatives": "symbolic (sympy.diff, Price and scale identities)" if grad
                                else "numeric (Richardson-extrapolated central differences of C)"})
