"""Max-pool kernels: psi(u) = max_j phi(u_j) over k i.i.d. nodes (docs/theory.md section 4).

Monotone non-decreasing phi: psi = phi(max_j u_j), and the maps are integrals against the law of M_k,
the maximum of k standard normals, and against h_k = k F^(k-1) rho_c + k(k-1) F^(k-2) F_s F_t, the
density of the two maxima; dC = k E[phi'(u_1) phi'(v_1) F(s_1, t_1)^(k-1)]. Closed forms where they
exist (method names ``even identity``, ``M_k moments``, ``k=2 split``, ``mean + |diff|``); otherwise an
unevaluated Integral of kind ("max1", k, f), ("max2", k, f, g) or ("argmax2", k, f, g), evaluated by
quadrature.max_expect1 / max_expect2 in float64 or at dps=N.

Non-monotone phi (generalised order statistics on the level sets of phi): kinds ("full1", k, f, phi)
and ("full2", k, f, g, phi, argmax_only), evaluated by numeric.pool.levelsets (argmax_expect1/2 in
float64, argmax_expect1_mp/2_mp at dps=N; C, dC refused at |c| = 1 with q1 != q2 and for flat pieces at
nonzero values). Numerics: docs/numerics.md sections 4 and 5.
"""
from __future__ import annotations

import sympy as sp

from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import is_monotone
from symfield.symbolic.formula import X as x
from symfield.symbolic.integrals import GaussianIntegral, Integrand, Kind
from symfield.symbolic.kernel_type import MAPS, Kernel

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12
_m, _s, _t = sp.symbols("m s t", real=True)


def _ncdf(w):
    return (1 + sp.erf(w / sp.sqrt(2))) / 2


def max_integral1(f, k):
    """E[f(sqrt(q) M_k)] as an unevaluated integral against the density of M_k."""
    f = sp.sympify(f)
    return GaussianIntegral(f.subs(x, sp.sqrt(q) * _m) * k * G.normal_pdf(_m) * _ncdf(_m) ** (k - 1),
                            (_m, -sp.oo, sp.oo), integrand=Integrand(Kind.MAX1, f, k=k))


def max_integral2(f, g, k, argmax_only=False):
    """E[f(sqrt(q1) S) g(sqrt(q2) T)] against h_k (argmax_only: against k F^(k-1) rho_c)."""
    c = q12 / sp.sqrt(q1 * q2)
    dens = sp.Function(f"a_{k}" if argmax_only else f"h_{k}")(_s, _t, c)
    spec = Integrand(Kind.ARGMAX2 if argmax_only else Kind.MAX2, sp.sympify(f), sp.sympify(g), k=k)
    return GaussianIntegral(f.subs(x, sp.sqrt(q1) * _s) * g.subs(x, sp.sqrt(q2) * _t) * dens,
                            (_s, -sp.oo, sp.oo), (_t, -sp.oo, sp.oo), integrand=spec)


def _halfmoments(n, k):
    """(A+_n, A-_n) or None when no exact value is tabled."""
    if n == 0:
        return 1 - sp.Rational(1, 2**k), sp.Rational(1, 2**k)
    if k == 2 and n == 1:
        return (1 + sp.sqrt(2)) / (2 * sp.sqrt(sp.pi)), (1 - sp.sqrt(2)) / (2 * sp.sqrt(sp.pi))
    if k == 2 and n == 2:
        return sp.Rational(3, 4) + 1 / (2 * sp.pi), sp.Rational(1, 4) - 1 / (2 * sp.pi)
    return None


def max_expect1(f, k, g=sp.Integer(1)):
    """(E[(f g)(sqrt(q) M_k)], method): closed form where one of the rules applies, else the integral."""
    f, g = sp.sympify(f), sp.sympify(g)
    if k == 2 and sp.simplify(f * g - (f * g).subs(x, -x)) == 0:
        e = G.expect1(f, g)
        return e.value, f"even identity E f(M_2) = E f(z) ({e.method})"
    f = f * g
    h = G.homogeneous(f)
    if h is not None and (A := _halfmoments(h[0], k)) is not None:
        n, a, b = h
        return sp.simplify(q ** sp.Rational(n, 2) * (b * A[0] + a * A[1])), "M_k moments"
    if k == 2:
        fe, fo = (f + f.subs(x, -x)) / 2, (f - f.subs(x, -x)) / 2
        e = G.expect1(sp.simplify(fe))
        o = G.expect2(sp.simplify(fo), sp.erf(x / sp.sqrt(2)))
        if e.closed and o.closed:
            val = e.value + o.value.subs({q1: q, q2: 1, q12: sp.sqrt(q)})
            return sp.simplify(val), "k=2 split"
    return max_integral1(f, k), "integral (order statistic)"


def _linear_coeff(phi):
    b = sp.simplify(phi / x)
    return b if not b.has(x) else None


def max_kernel(single: Kernel, act) -> Kernel:
    """Kernel of max_j phi(u_j), k = act.k >= 2 (called by kernel._kernel)."""
    phi, k = single.act.expr, act.k
    if not is_monotone(phi):
        return _full_kernel(single, act)
    d1 = sp.diff(phi, x)
    res = {}
    res["V"] = max_expect1(phi, k, phi)
    res["mean"] = max_expect1(phi, k)
    res["dpsi2"] = max_expect1(d1, k, d1)
    V = res["V"][0]
    if not V.has(sp.Integral):
        res["dV"] = sp.simplify(sp.diff(V, q)), f"d/dq of V ({res['V'][1]})"
    else:
        val, how = max_expect1(sp.expand(x * phi * d1), k)
        res["dV"] = val / q, f"E[x phi phi'(sqrt(q) M_k)]/q ({how})"
    b = _linear_coeff(phi)
    if b is not None and k == 2:
        C = b**2 * (q12 / 2 + G.expect2(sp.Abs(x), sp.Abs(x)).value / 2)
        res["C"] = C, "mean + |diff| (abs arc-cosine kernel)"
    else:
        res["C"] = max_integral2(phi, phi, k), "integral (order statistic h_k)"
    if not res["C"][0].has(sp.Integral):
        res["dC"] = sp.simplify(sp.diff(res["C"][0], q12)), f"d/dq12 of C ({res['C'][1]})"
    else:
        res["dC"] = max_integral2(d1, d1, k, argmax_only=True), "integral (argmax term k F^(k-1) rho_c)"
    return Kernel(act, *(res[n][0] for n in MAPS), methods={n: res[n][1] for n in MAPS},
                  kinks=single.kinks, base=single)


# ---------------------------------------------------------------- non-monotone: level sets
LEVELSET_METHOD = "generalised order statistics of phi's level sets (phi not monotone)"


def argmax_integral1(f, phi, k):
    """E[f(u_A)] = k int f(sqrt(q) m) F_Y(phi(sqrt(q) m); q)^(k-1) n(m) dm, u_A the argmax node,
    F_Y(y; q) = P(phi(sqrt(q) z) <= y) (levelsets.py)."""
    f, phi = sp.sympify(f), sp.sympify(phi)
    u = sp.sqrt(q) * _m
    FY = sp.Function("F_Y")(phi.subs(x, u), q)
    return GaussianIntegral(f.subs(x, u) * k * FY ** (k - 1) * G.normal_pdf(_m), (_m, -sp.oo, sp.oo),
                            integrand=Integrand(Kind.LEVEL1, f, k=k, phi=phi))


def argmax_integral2(f, g, phi, k, argmax_only=False):
    """E[f(u_A) g(v_B)] against the density of the argmax pair, g_k^phi (argmax_only: its A = B part)."""
    f, g, phi = sp.sympify(f), sp.sympify(g), sp.sympify(phi)
    dens = sp.Function(f"a_{k}^phi" if argmax_only else f"h_{k}^phi")(_s, _t, q1, q2, q12)
    spec = Integrand(Kind.LEVEL2, f, g, k=k, phi=phi, argmax_only=argmax_only)
    return GaussianIntegral(f.subs(x, sp.sqrt(q1) * _s) * g.subs(x, sp.sqrt(q2) * _t) * dens,
                            (_s, -sp.oo, sp.oo), (_t, -sp.oo, sp.oo), integrand=spec)


def _full_kernel(single: Kernel, act) -> Kernel:
    """Non-monotone phi: the argmax node u_A (density k F_Y(phi(u))^(k-1) n(u)) and the argmax pair
    (u_A, v_B) (density k H^(k-1) rho + k(k-1) H^(k-2) P1 P2 n n, see levelsets.py) replace the
    order statistics; psi = phi(u_A), and d psi/d u_j = phi'(u_j) [j = A]."""
    phi, k = single.act.expr, act.k
    d1 = sp.diff(phi, x)
    res = dict(V=argmax_integral1(phi**2, phi, k), mean=argmax_integral1(phi, phi, k),
               dpsi2=argmax_integral1(d1**2, phi, k), dV=argmax_integral1(sp.expand(x * phi * d1), phi, k) / q,
               C=argmax_integral2(phi, phi, phi, k), dC=argmax_integral2(d1, d1, phi, k, argmax_only=True))
    how = {n: f"{LEVELSET_METHOD}: density k F_Y(phi(u))^(k-1) n(u) of the argmax node" for n in ("V", "mean", "dpsi2")}
    how["dV"] = f"{LEVELSET_METHOD}: E[u_A phi phi'(u_A)]/q"
    how["C"] = f"{LEVELSET_METHOD}: argmax-pair density k H^(k-1) rho + k(k-1) H^(k-2) P1 P2 n n"
    how["dC"] = f"{LEVELSET_METHOD}: argmax term k H^(k-1) rho"
    return Kernel(act, *(res[n] for n in MAPS), methods=how, kinks=single.kinks, base=single)
