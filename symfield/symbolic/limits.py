"""The large- and small-variance limits of a kernel: the maps as q -> inf and as q -> 0, derived by SymPy.

If phi grows linearly, phi(x)/x -> b as x -> +inf and -> a as x -> -inf (a, b finite, not both 0:
gelu, silu, softplus, mish and elu have a = 0, b = 1; x erf(x) has a = -1, b = 1), then
phi(t u)/t -> phi_inf(u) = a min(u, 0) + b max(u, 0) as t -> inf, with |phi(x)| <= A (1 + |x|), so by
dominated convergence, for psi built from phi (a pool of k nodes included) and its limit psi_inf,

    V(q)/q -> V_inf(1),   C(q, q, c q)/q -> C_inf(1, 1, c),   E[psi'^2](q) -> E[psi_inf'^2],

the maps of the positively homogeneous psi_inf (arc-cosine closed forms; max-pools: their homogeneous
table). These are the EXACT normalised c-map and slope chi1 where q* = inf, instead of the maps at
some large q, and they cost microseconds.

As q -> 0 the same holds with the slopes at 0: if phi(0) = 0 and phi(x)/x -> b as x -> 0+ and a as
x -> 0- (gelu, silu: a = b = 1/2; tanh: a = b = 1; elu: a = alpha, b = 1), phi(t u)/t -> phi_0(u) = a min(u, 0)
+ b max(u, 0) as t -> 0, dominated by Lip(phi) |u| on |x| <= 1 (and |phi(x)| <= A (1 + |x|^p) beyond), so
V(q)/q -> V_0(1), C(q, q, c q)/q -> C_0(1, 1, c), E[psi'^2](q) -> E[psi_0'^2]: the exact limit c-map
where q* = 0 (:func:`zero_limit_kernel`). It is the identity when psi_0 is linear (a = b, no pool or an
average): there c* is decided by the next order, and no limit kernel is returned.
"""
from __future__ import annotations

from symfield.core.errors import SYMPY_GAVE_UP
import sympy as sp

from symfield.core import timelimit
from symfield.symbolic.activation import Activation
from symfield.symbolic.formula import X as x
from symfield.symbolic.gaussian import homogeneous
from symfield.symbolic.kernel import Kernel, kernel
from symfield.symbolic.stored import stored
from symfield.core import caches

LIMIT_SECONDS = 20.0       # budget for SymPy's two limits
_t = sp.Symbol("t", positive=True)
_DONE: dict = caches.memo()


def linear_growth(expr) -> tuple | None:
    """(a, b) with phi(x)/x -> b (x -> +inf) and a (x -> -inf), both finite and not both 0; else None
    (bounded, sub- or super-linear phi, or limits SymPy cannot decide within LIMIT_SECONDS)."""
    try:
        a, b = _limits(expr)
    except SYMPY_GAVE_UP:
        return None
    if not all(v.is_real and v.is_finite for v in (a, b)) or (a == 0 and b == 0):
        return None
    return a, b


def slopes_at_zero(expr) -> tuple | None:
    """(a, b) with phi(0) = 0, phi(x)/x -> b (x -> 0+) and a (x -> 0-), both finite and not both 0; else None
    (phi(0) != 0, phi'(0) = 0, or limits SymPy cannot decide within LIMIT_SECONDS)."""
    try:
        a, b = _zero_limits(expr)
    except SYMPY_GAVE_UP:
        return None
    if a is None or not all(v.is_real and v.is_finite for v in (a, b)) or (a == 0 and b == 0):
        return None
    return a, b


@stored
def _zero_limits(expr):
    """(phi(x)/x as x -> 0-, as x -> 0+), or (None, None) where phi(0) != 0, under LIMIT_SECONDS."""
    def limits():
        if sp.limit(expr.subs(x, _t), _t, 0) != 0 or sp.limit(expr.subs(x, -_t), _t, 0) != 0:
            return None, None
        return sp.limit(expr.subs(x, -_t) / (-_t), _t, 0), sp.limit(expr.subs(x, _t) / _t, _t, 0)
    return timelimit.bounded("the q -> 0 limit", str(expr), limits, seconds=LIMIT_SECONDS)


@stored
def _limits(expr):
    """(phi(x)/x as x -> -inf, as x -> +inf), under LIMIT_SECONDS."""
    def limits():
        b = sp.limit(expr.subs(x, _t) / _t, _t, sp.oo)
        a = sp.limit(expr.subs(x, -_t) / (-_t), _t, sp.oo)
        return a, b
    return timelimit.bounded("the q -> inf limit", str(expr), limits, seconds=LIMIT_SECONDS)


def limit_kernel(K: Kernel) -> Kernel | None:
    """The kernel of psi_inf (module docstring) for a psi that is not itself homogeneous, else None."""
    if K in _DONE:
        return _DONE[K]
    out = None
    if homogeneous(K.act.expr) is None:
        ab = linear_growth(K.act.expr)
        if ab is not None:
            a, b = ab
            expr = a * sp.Min(x, 0) + b * sp.Max(x, 0)
            pool = "" if K.act.pool is None else f"+{K.act.pool}{K.act.k}"
            name = f"{K.act.single.name}[q->inf]{pool}"
            out = kernel(Activation(name, expr, K.act.pool, K.act.k))
    _DONE[K] = out
    return out


_ZERO: dict = caches.memo()


def zero_limit_kernel(K: Kernel) -> Kernel | None:
    """The kernel of psi_0 (module docstring) for a psi that is not itself homogeneous and whose limit c-map is
    not the identity (a max-pool of k >= 2 nodes, or a != b), else None."""
    if K in _ZERO:
        return _ZERO[K]
    out = None
    pooled = K.act.pool == "max" and K.act.k >= 2
    if (pooled or any(float(k) == 0 for k in K.kinks)) and homogeneous(K.act.expr) is None:   # else a = b
        ab = slopes_at_zero(K.act.expr)
        if ab is not None and (pooled or ab[0] != ab[1]):
            a, b = ab
            expr = a * x if a == b else a * sp.Min(x, 0) + b * sp.Max(x, 0)
            pool = "" if K.act.pool is None else f"+{K.act.pool}{K.act.k}"
            out = kernel(Activation(f"{K.act.single.name}[q->0]{pool}", expr, K.act.pool, K.act.k))
    _ZERO[K] = out
    return out
