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

from symfield.core.errors import InvalidValue, SYMPY_GAVE_UP
from functools import lru_cache

import sympy as sp

from symfield.core import timelimit
from symfield.symbolic import gaussian as G
from symfield.symbolic.activation import Activation, activation, kinks
from symfield.symbolic.formula import X as x
from symfield.symbolic.kernel_type import MAPS, Kernel
from symfield.symbolic.pool import max_kernel
from symfield.symbolic.stored import stored
from symfield.core import caches

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12


KERNEL_SECONDS = 300.0  # time budget of all maps of one activation (and timelimit.STEP_MEMORY of memory)
STEP_SECONDS = 120.0    # time budget of one step (an expectation, a simplification)


def kernel(act: str | Activation) -> Kernel:
    """Symbolic kernel maps of ``act`` (cached); TooExpensive (a ValueError) past the budgets.

    Parameters
    ----------
    act : str or Activation
        Built-in name, formula in x or :class:`Activation` (pools included).

    Returns
    -------
    Kernel
        The maps V, C, mean, dpsi2, dC, dV as SymPy expressions in q or (q1, q2, q12).

    Examples
    --------
    >>> sf.kernel("relu").V
    q/2
    """
    if not isinstance(act, Activation):
        act = activation(act)
    found = _DONE.get(act)
    if found is None:   # the budget's watchdog thread only for a derivation, not for a cache hit
        found = timelimit.bounded("the kernel maps", act.name, _kernel, act, seconds=KERNEL_SECONDS)
        if len(_DONE) >= 256:
            _DONE.clear()
        _DONE[act] = found
    return found


_DONE: dict = caches.memo()


def _step(what, name, fn, *args):
    """One symbolic step under its STEP_SECONDS budget."""
    return timelimit.bounded(what, name, fn, *args, seconds=STEP_SECONDS)


@lru_cache(maxsize=128)
@stored
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
    if d1.has(sp.DiracDelta) and _continuous(phi, d1):   # e.g. x*step(x): x delta(x) = 0
        d1 = _no_dirac(d1)
    d2 = sp.diff(d1, x)
    V = _step("the expectation V", name, G.expect1, phi, phi)
    C = _step("the expectation C", name, G.expect2, phi, phi)
    mean = _step("the expectation mean", name, G.expect1, phi)
    dpsi2 = _step("the expectation dpsi2", name, G.expect1, d1, d1)
    dC = _step("the expectation dC", name, G.expect2, d1, d1)
    if not dC.closed and C.closed:
        dC = G.Expectation(_step("the simplification of dC", name, _simple_diff, C.value, q12),
                           f"d/dq12 of C ({C.method})")
    if V.closed:
        dV = G.Expectation(_step("the simplification of dV", name, _simple_diff, V.value, q),
                           f"d/dq of V ({V.method})")
    else:
        dV = _step("the expectation dV", name, _dV, phi, d1, d2, V.value)
    if d1.has(sp.DiracDelta):
        dpsi2, dC = _jump_maps(phi, dC, C)
    exps = dict(V=V, C=C, mean=mean, dpsi2=dpsi2, dC=dC, dV=dV)
    return Kernel(Activation(name, phi), *(exps[n].value for n in MAPS),
                  methods={n: exps[n].method for n in MAPS}, kinks=kinks(phi))


def _simple_diff(expr, var):
    return sp.simplify(sp.diff(expr, var))


def _no_dirac(e):
    return e.replace(sp.DiracDelta, lambda *a: sp.S.Zero)


def _dV(phi, d1, d2, V):
    """dV/dq = E[phi'^2 + phi phi''] (Gaussian integration by parts) for a continuous phi.

    A kink of phi at x0 (phi' jumps by J = phi'(x0+) - phi'(x0-)) puts J delta(x - x0) into phi'':
    E[phi(u) J delta(u - x0)] = phi(x0) J exp(-x0^2/(2q))/sqrt(2 pi q), added in closed form beside
    the integral of the regular part. A jump of phi itself (phi' has a delta) or a kink whose J
    SymPy cannot resolve: the score form dV = (E[phi(u)^2 u^2]/q - V)/(2q) (d/dq of the N(0, q) density),
    with no derivative of phi at all."""
    if not d2.has(sp.DiracDelta):
        return G.Expectation(G.integral1(d1**2 + phi * d2), "integral")
    score = G.Expectation(G.integral1(phi**2 * x**2) / (2 * q**2) - V / (2 * q), "integral (score form)")
    if d1.has(sp.DiracDelta):
        return score
    reg1, dirac = _no_dirac(d1), 0
    for x0 in _dirac_points(d2):
        if x0 is None:
            return score
        right, left = _side(reg1, x0, 1), _side(reg1, x0, -1)
        value = None if right is None or left is None else sp.simplify(phi.subs(x, x0) * (right - left))
        if value is None or not value.is_finite or value.has(x, sp.DiracDelta):
            return score
        dirac += value * sp.exp(-x0**2 / (2 * q)) / sp.sqrt(2 * sp.pi * q)
    return G.Expectation(G.integral1(d1**2 + phi * _no_dirac(d2)) + dirac, "integral + kink terms")


def _side(f, x0, side):
    """lim f(x) as x -> x0 from the right (side 1) or left (-1): Heaviside and sign (the discontinuous
    pieces) take the sign of the leading term of their argument in e at x = x0 +- e, e -> 0+; the
    continuous rest (Max, Min, Abs, ...) its value at e = 0. None if a sign is not decided."""
    e = sp.Symbol("e", positive=True)
    g = f.subs(x, x0 + side * e)
    undecided = []

    def resolve(n):
        lead = sp.expand(n.args[0]).as_leading_term(e) if n.args[0].has(e) else n.args[0]
        if not (lead.is_positive or lead.is_negative):
            undecided.append(n)
        return n.func(lead, *n.args[1:])
    g = g.replace(lambda n: isinstance(n, (sp.Heaviside, sp.sign)), resolve)
    return None if undecided else g.subs(e, 0)


def _continuous(phi, d1):
    """True when phi has no jump at the points of the Dirac deltas of phi' (their weights vanish)."""
    for x0 in _dirac_points(d1):
        right, left = (None, None) if x0 is None else (_side(phi, x0, 1), _side(phi, x0, -1))
        if right is None or left is None or sp.simplify(right - left) != 0:
            return False
    return True


def _dirac_points(d2):
    """Real roots x0 of the arguments of the DiracDelta atoms of phi'' (None where SymPy cannot list them)."""
    points = set()
    for atom in d2.atoms(sp.DiracDelta):
        if len(atom.args) != 1 or not atom.args[0].is_polynomial(x):
            return [None]
        try:
            roots = sp.Poly(atom.args[0], x).real_roots()
        except (sp.PolynomialError, *SYMPY_GAVE_UP):
            roots = [r for r in sp.solve(atom.args[0], x) if r.is_real]
        points.update(roots)
    return sorted(points, key=float)


def _jump_maps(phi, dC, C):
    """phi jumps (phi' holds a Dirac delta): E[phi'^2] = oo, so chi1 is infinite at every sigma_w2 > 0;
    dC = d/dq12 of C only when C is closed (else refused: no Gaussian quadrature of a delta)."""
    dpsi2 = G.Expectation(sp.oo, "infinite: phi jumps, so E[phi'^2] diverges (phi' has a Dirac delta)")
    if dC.value.has(sp.DiracDelta):
        raise InvalidValue(f"the activation {phi} jumps (phi' has a Dirac delta) and its covariance map has no "
                         "closed form, so dC/dq12 cannot be computed; use a continuous activation")
    return dpsi2, dC


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
