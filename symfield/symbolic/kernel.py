"""The mean-field maps of an activation as SymPy expressions.

For psi (phi itself, or a pool of phi over k nodes), with u ~ N(0, q I_k) and
(u_j, v_j) ~ N(0, [[q1, q12], [q12, q2]]) i.i.d. over the k nodes:

    V(q)           = E[psi(u)^2]                         variance map  q' = sigma_w2 V + sigma_b2
    C(q1, q2, q12) = E[psi(u) psi(v)]                    covariance map
    mean(q)        = E[psi(u)]
    dpsi2(q)       = E[sum_j (d psi/du_j)^2]             chi1 = sigma_w2 dpsi2(q*)
    dC(q1,q2,q12)  = E[sum_j d_j psi(u) d_j psi(v)]      = dC/dq12 (Price); xi_c
    dV(q)          = dV/dq = E[phi'^2 + phi phi'']        (Gaussian integration by parts); xi_q

Exact special cases kept beside the maps: C(q1, q2, 0) = mean(q1) mean(q2) and C(q, q, q) = V(q).
"""
from __future__ import annotations

from functools import lru_cache

import sympy as sp

from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation, kinks
from symfield.symbolic.formula import X as x
from symfield.symbolic.kernel_type import MAPS, Kernel
from symfield.symbolic.pool import max_kernel

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12


def kernel(act) -> Kernel:
    """Symbolic kernel maps of ``act`` (cached)."""
    if not isinstance(act, Activation):
        act = activation(act)
    return _kernel(act)


@lru_cache(maxsize=128)
def _kernel(act: Activation) -> Kernel:
    single = _single(act.expr, act.single.name)
    if act.pool is None:
        return single
    if act.k == 1:
        return _relabel(single, act)
    if act.pool == "avg":
        return _avg(single, act)
    return max_kernel(single, act)


def _relabel(k: Kernel, act) -> Kernel:
    return Kernel(act, *(k[n] for n in MAPS), methods=k.methods, kinks=k.kinks, base=k)


@lru_cache(maxsize=128)
def _single(phi: sp.Expr, name: str) -> Kernel:
    d1 = sp.diff(phi, x)
    d2 = sp.diff(phi, x, 2)
    V = G.expect1(phi, phi)
    C = G.expect2(phi, phi)
    mean = G.expect1(phi)
    dpsi2 = G.expect1(d1, d1)
    dC = G.expect2(d1, d1)
    if not dC.closed and C.closed:
        dC = G.Expectation(sp.simplify(sp.diff(C.value, q12)), f"d/dq12 of C ({C.method})")
    if V.closed:
        dV = G.Expectation(sp.simplify(sp.diff(V.value, q)), f"d/dq of V ({V.method})")
    else:
        dV = G.Expectation(G.integral1(d1**2 + phi * d2), "integral")
    exps = dict(V=V, C=C, mean=mean, dpsi2=dpsi2, dC=dC, dV=dV)
    return Kernel(Activation(name, phi), *(exps[n].value for n in MAPS),
                  methods={n: exps[n].method for n in MAPS}, kinks=kinks(phi))


def _avg(single: Kernel, act: Activation) -> Kernel:
    """avg-pool: E[psi^2] = V/k + (1 - 1/k) E[phi]^2, C likewise, chi1 integrand / k."""
    k = sp.Integer(act.k)
    m = single.mean
    V = single.V / k + (1 - 1 / k) * m**2
    C = single.C / k + (1 - 1 / k) * m.subs(q, q1) * m.subs(q, q2)
    dV = single.dV / k + (1 - 1 / k) * 2 * m * sp.diff(m, q) if not m.has(sp.Integral) else \
        single.dV / k + (1 - 1 / k) * 2 * m * _mean_slope(single)
    methods = {n: f"avg-pool identity ({single.methods[n]})" for n in MAPS}
    return Kernel(act, V, C, m, single.dpsi2 / k, single.dC / k, dV, methods=methods,
                  kinks=single.kinks, base=single)


def _mean_slope(single: Kernel):
    """d/dq E[phi(sqrt(q) z)] = E[phi''(sqrt(q) z)]/2 (Gaussian integration by parts)."""
    phi = single.act.expr
    return G.expect1(sp.diff(phi, x, 2) / 2).value
