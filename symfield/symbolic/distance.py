"""The distance map: D = E[(psi(u) - psi(v))^2], the layer map of d = q_aa + q_bb - 2 q_ab.

    d' = sigma_w2 D(q_a, q_b, d)      (no bias term; residual: d' = d + alpha^2 sigma_w2 D)
    D(q1, q2, d) = V(q1) + V(q2) - 2 C(q1, q2, q12),   q12 = (q1 + q2 - d)/2      (docs/theory.md section 7)

In float64 the plain difference loses every digit once 1 - c ~ 1e-16, so the forms here are written in d
itself, without cancellation as d -> 0: ``arc-cosine`` (psi = alpha x + beta |x| or alpha + beta
sign(x)), ``exp groups`` (psi built from x^m e^(a x), summed with expm1), ``atan2 pairs`` (erf-type
kernels, one atan2 of a difference computed exactly) and ``avg-pool``. Every form is checked when derived
against 300-digit arithmetic down to d/q = 1e-200; a form that fails (or a kernel no rule fits) keeps the
plain difference with ``stable`` False. Kernels without a closed form have no symbolic D (``near_eq``
None): numeric.distance evaluates them. The forms are used where c >= 1/2 ("near"), the plain
difference elsewhere ("far"). docs/numerics.md section 6.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, SYMPY_GAVE_UP
from dataclasses import dataclass
from functools import lru_cache

import mpmath
import sympy as sp
from sympy.codegen.cfunctions import expm1

from symfield.core import timelimit
from symfield.symbolic import gaussian as G
from symfield.symbolic.gaussian import homogeneous
from symfield.symbolic.kernel_type import Kernel

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12
d = sp.Symbol("d", nonnegative=True)
CHECK_RATIOS = (1e-3, 1e-9, 1e-30, 1e-200)   # d/q where a derived form is checked
CHECK_QS = (0.37, 2.9)
RULE_SECONDS = 120.0                         # budget of one rule, and of its check (else: plain difference)
CHECK_TOL = 1e-13                            # relative, float64 form against 300-digit plain difference


class SinMinusTCos(sp.Function):
    """W(t) = sin t - t cos t = t^3/3 - t^5/30 + t^7/840 - ..., without cancellation as t -> 0."""
    nargs = 1

    @classmethod
    def eval(cls, t):
        if t.is_zero:
            return sp.Integer(0)

    def fdiff(self, argindex=1):
        t = self.args[0]
        return t * sp.sin(t)

    def _eval_rewrite_as_sin(self, t, **kwargs):
        return sp.sin(t) - t * sp.cos(t)

    def _eval_evalf(self, prec):
        return self.rewrite(sp.sin)._eval_evalf(prec + 2 * prec)

    def _eval_is_real(self):
        return self.args[0].is_real

    def _latex(self, printer):
        return r"W\left(%s\right)" % printer._print(self.args[0])


def sin_minus_tcos_mp(t):
    """W(t) in mpmath at the working precision (series for |t| < 1, direct otherwise)."""
    t = mpmath.mpf(t)
    if abs(t) >= 1:
        return mpmath.sin(t) - t * mpmath.cos(t)
    t2, term, total, k = t * t, t ** 3 / 3, mpmath.mpf(0), 1
    eps = mpmath.eps * abs(term)
    while abs(term) > eps:
        total += term
        # term_k = (-1)^(k+1) t^(2k+1) 2k/(2k+1)!
        term = -term * t2 * (k + 1) / (k * (2 * k + 2) * (2 * k + 3))
        k += 1
    return total


@dataclass(frozen=True)
class Distance:
    """D in three forms: ``near_eq`` (q, d) and ``near`` (q1, q2, d) for c >= 1/2, ``far`` (q1, q2, q12)."""
    near_eq: sp.Expr | None
    near: sp.Expr | None   # unequal norms: the rule's form, else the plain difference in (q1, q2, d)
    far: sp.Expr
    method: str
    stable: bool           # near_eq checked cancellation-free (False: the plain difference, or no closed form)


def plain(K: Kernel, args="near"):
    """V(q1) + V(q2) - 2 C: in (q1, q2, q12) for "far", in (q1, q2, d) for "near", (q, d) for "eq"."""
    return _plain(K.V, K.C, args)


def plain_distance(V, C) -> Distance:
    """The plain difference as a Distance (maps V, C given directly, no stable form)."""
    return Distance(_plain(V, C, "eq"), _plain(V, C, "near"), _plain(V, C, "far"),
                    "plain difference V + V - 2C (loses digits as c -> 1)", False)


def _plain(V, C, args):
    far = V.subs(q, q1) + V.subs(q, q2) - 2 * C
    if args == "far":
        return far
    near = far.subs(q12, (q1 + q2 - d) / 2)
    return near if args == "near" else near.subs({q1: q, q2: q})


@lru_cache(maxsize=128)
def distance(K: Kernel) -> Distance:
    """The distance map of kernel ``K`` (cached); see the module docstring and docs/numerics.md section 6."""
    far = plain(K, "far")
    if not K.closed_form:
        return Distance(None, None, far, "no closed form (numeric rule)", False)
    for method, rule in _RULES:
        try:   # past its budget (TooExpensive, a ValueError) a rule counts as not applying: plain difference
            forms = timelimit.bounded(f"the distance rule {method}", K.act.name, rule, K, seconds=RULE_SECONDS)
            ok = forms is not None and timelimit.bounded(f"the check of the distance rule {method}", K.act.name,
                                                         _checked, K, forms[0], seconds=RULE_SECONDS)
        except SYMPY_GAVE_UP:
            ok = False
        if ok:
            near = forms[1] if forms[1] is not None else plain(K, "near")
            return Distance(forms[0], near, far, method, True)
    return plain_distance(K.V, K.C)


# ------------------------------------------------------------------------------------------- rules
def _arccos(K):
    if K.act.pool is not None and K.act.k > 1:
        return None
    h = homogeneous(K.act.expr)
    if h is None or h[0] > 1:
        return None
    n, a, b = h
    alpha, beta = (a + b) / 2, (b - a) / 2
    r = sp.sqrt(q1 * q2)
    e = d - (sp.sqrt(q1) - sp.sqrt(q2)) ** 2
    theta = 2 * sp.atan2(sp.sqrt(e), sp.sqrt(q1 + q2 + 2 * r - d))
    if n == 1:
        near = (alpha ** 2 + beta ** 2) * d - 4 * beta ** 2 / sp.pi * r * SinMinusTCos(theta)
    else:
        near = 4 * beta ** 2 * theta / sp.pi
    return near.subs({q1: q, q2: q}), near


def _split_exp(term):
    """term = coeff * exp(arg): (coeff, arg)."""
    coeff, arg = sp.Integer(1), sp.Integer(0)
    for f in sp.Mul.make_args(sp.powsimp(term, combine="exp")):
        base, ex = f.as_base_exp()
        if isinstance(f, sp.exp):
            arg += f.args[0]
        elif base == sp.E:
            arg += ex
        else:
            coeff *= f
    return coeff, sp.expand(arg)


def _exp_groups(K):
    E = sp.expand(plain(K, "eq"))
    if E.has(sp.atan2, sp.atan, sp.asin, sp.acos, sp.erf, sp.erfc, sp.log) or E.has(sp.Abs):
        return None
    groups = {}
    for term in sp.Add.make_args(E):
        c, arg = _split_exp(term)
        kd = arg.coeff(d, 1)
        A = sp.expand(arg - kd * d)
        if A.has(d) or c.has(sp.exp):
            return None
        groups.setdefault(A, []).append((c, kd))
    out = sp.Integer(0)
    for A, terms in groups.items():
        poly = sp.expand(sum(c for c, _ in terms))
        if poly.subs(d, 0) != 0:
            return None   # the d^0 part cancels across groups only: no stable form from this rule
        rest = sum(c * expm1(kd * d) for c, kd in terms if kd != 0)
        out += sp.exp(A) * (sp.factor(poly) + rest)
    return out, None


def _as_atan2(f):
    if isinstance(f, sp.atan2):
        return f.args
    if isinstance(f, sp.atan):
        num, den = sp.fraction(sp.together(f.args[0]))
        return num, den
    return None


def _atan2_pairs(K):
    E = sp.expand(plain(K, "eq"))
    pos, neg = [], []
    for term in sp.Add.make_args(E):
        c, fs = term.as_independent(sp.atan2, sp.atan, as_Add=False)
        yx = _as_atan2(fs)
        if yx is None or c.has(q, d):
            return None
        (pos if c.is_positive else neg).append((c, yx))
    if sum(c for c, _ in pos) + sum(c for c, _ in neg) != 0:
        return None
    out = sp.Integer(0)
    for (c, (y2, x2)) in neg:          # each negative term is paired with the positive ones in proportion
        for (cp, (y1, x1)) in pos:
            w = cp / sum(p for p, _ in pos)
            out += -c * w * sp.atan2(_stable_cross(y1, x2, x1, y2), x1 * x2 + y1 * y2)
    return out, None


def _stable_cross(a1, b1, a2, b2):
    """a1 b1 - a2 b2 for positive terms with radicals, as (a1^2 b1^2 - a2^2 b2^2)/(a1 b1 + a2 b2), numerator factored."""
    num = sp.factor(sp.expand(a1 ** 2 * b1 ** 2 - a2 ** 2 * b2 ** 2))
    if num.subs(d, 0) != 0 and sp.simplify(num.subs(d, 0)) != 0:
        raise InvalidValue("no cancellation-free form")
    return num / (a1 * b1 + a2 * b2)


def _avg(K):
    if K.act.pool != "avg" or K.act.k <= 1 or K.base is None:
        return None
    base = distance(K.base)
    if not base.stable:
        return None
    k = sp.Integer(K.act.k)
    m = K.base.mean
    near = base.near / k + (1 - 1 / k) * (m.subs(q, q1) - m.subs(q, q2)) ** 2
    return base.near_eq / k, near


_RULES = (("arc-cosine (theta by its half angle, W = sin t - t cos t)", _arccos),
          ("avg-pool identity D_phi / k", _avg),
          ("exponential groups with expm1", _exp_groups),
          ("atan2 differences with a factored cross term", _atan2_pairs))


# ------------------------------------------------------------------------------------------- check
def _checked(K, near_eq) -> bool:
    """near_eq in float64 against the plain difference at 300 digits, c -> 1 (CHECK_RATIOS)."""
    import math   # noqa: PLC0415  (local: keeps the module's namespace to the maths)
    mods = [{"SinMinusTCos": _sin_minus_tcos_float, "expm1": math.expm1}, "math"]
    try:
        f64 = sp.lambdify((q, d), near_eq, modules=mods)
        exact = sp.lambdify((q, d), plain(K, "eq"), modules="mpmath")
        for qv in CHECK_QS:
            for ratio in CHECK_RATIOS:
                dv = qv * ratio
                with mpmath.workdps(320):
                    ref = mpmath.mpmathify(exact(mpmath.mpf(qv), mpmath.mpf(dv)))
                got = float(f64(qv, dv))
                if ref == 0 or not abs(got - ref) <= CHECK_TOL * abs(ref):
                    return False
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, NameError):
        return False
    return True


def _sin_minus_tcos_float(t):
    with mpmath.workdps(20):
        return float(sin_minus_tcos_mp(t))
