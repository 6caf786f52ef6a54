"""Node values a table is built from and checked against: V, C and R = (V - C)/(q sin^2(theta/2)) in float64.

- each integral E[f(u) g(v)] with smooth f, g (tanh, softplus, sigmoid, silu, gelu, mish, their avg-pools):
  the polar rule (:mod:`.polar`);
- max-pools of a monotone phi smooth except at x = 0: one :class:`symfield.numeric.pool.maxrule.Rule` per theta,
  at all the q-nodes of a panel at once;
- everything else (kinked activations, other max-pools): the error-controlled quadrature.
(docs/numerics.md section 3.)
"""
from __future__ import annotations

import math

import numpy as np
import sympy as sp

from symfield.numeric import evaluate as N
from symfield.numeric import quadrature as QD
from symfield.numeric.pool.maxrule import Rule
from symfield.numeric.tables.polar import Polar2, polar_eval_over_cos
from symfield.symbolic.formula import X as x
from symfield.symbolic.gaussian import q as Q
from symfield.symbolic.gaussian import q1 as Q1
from symfield.symbolic.gaussian import q2 as Q2
from symfield.symbolic.gaussian import q12 as Q12
from symfield.symbolic.integrals import Kind, integrals

def rule_kind(K) -> str:
    """How :class:`Evaluator` computes K's node values, read off C's integrals without building it: "rule"
    (C is one max-pool integral, MAX2, of a phi kinked at 0 at most: the max-pool rule), "polar" (phi kink-free,
    every integral of C a 2-D normal one, by the polar rule, or a 1-D one, once per q: an avg-pool's E[phi]^2
    terms) or "quadrature"."""
    atoms = integrals(K.C)
    if (len(atoms) == 1 and K.C == atoms[0] and atoms[0].integrand.kind is Kind.MAX2
            and set(float(v) for v in K.kinks) <= {0.0}):
        return "rule"
    smooth = not K.kinks and all(I.integrand.kind is Kind.NORMAL2 or I.integrand.kind.dims == 1 for I in atoms)
    return "polar" if smooth else "quadrature"


def _per_q(rule):
    """A 1-D integral's rule evaluated once per distinct q (a panel's nodes repeat each q over every theta)."""
    def once(s):
        u, inv = np.unique(np.asarray(s, dtype=float), return_inverse=True)
        return np.asarray(rule(u), dtype=float)[inv].reshape(np.shape(s))
    return once


class Evaluator:
    """Float64 node values of V(q) and C(q1, q2, q12) for the table builder.

    ``fast`` is True when every 2-D integral in C goes through the polar rule (then C at many
    theta for one q costs about as much as one theta)."""

    def __init__(self, K, parity):
        self.K = K
        if K.act.pool is None or K.act.k == 1:   # E[phi^2] by quadrature (also where V's closed form cancels)
            f2 = N.vectorised(K.act.expr ** 2, N.NUMPY_MODULES)
            self.V = lambda qv: QD.expect1_vec(f2, qv, kinks=tuple(K.kinks))
        else:
            self.V = N.evaluator(K.V, (Q,), tuple(K.kinks), None)
        impls, repl = {}, {}
        kind = rule_kind(K)
        self.R = None     # R(q, theta) = (V - C)/(q sin^2(theta/2)) without cancellation (set by Table)
        for i, I in enumerate(integrals(K.C)):
            spec = I.integrand
            name = f"_quad{i}"
            if spec.kind is Kind.NORMAL2 and not K.kinks:
                f = N.vectorised(spec.f, N.NUMPY_MODULES)
                g = f if spec.g == spec.f else N.vectorised(spec.g, N.NUMPY_MODULES)
                # parity of the pair: both odd -> odd modes only, both even -> even modes only
                impls[name] = Polar2(f, g, parity if spec.f == spec.g else 0, spec.f if spec.g == spec.f else None)
            elif spec.kind.dims == 1:
                impls[name] = _per_q(N.integral_rule(spec, tuple(K.kinks), None))
            else:
                impls[name] = N.integral_rule(spec, tuple(K.kinks), None)
            repl[I] = sp.Function(name)(*((I.scale(),) if spec.kind.dims == 1 else (Q1, Q2, Q12)))
        self.fast = kind != "quadrature"      # the polar rule for every integral, or the max-pool rule
        self.polars = [v for v in impls.values() if isinstance(v, Polar2) and v.f is v.g]
        self.maxrule = None
        if kind == "rule":
            spec = integrals(K.C)[0].integrand
            f = N.vectorised(spec.f, N.NUMPY_MODULES)
            g = f if spec.g == spec.f else N.vectorised(spec.g, N.NUMPY_MODULES)
            self.maxrule = (f, g, spec.k)
        atoms = list(K.C.atoms(sp.Integral))
        # C is one polar integral (single-node phi): C/cos(theta) directly for odd psi
        self.single = impls["_quad0"] if len(atoms) == 1 and K.C == atoms[0] and isinstance(impls.get("_quad0"), Polar2) else None
        fn = sp.lambdify((Q1, Q2, Q12), K.C.xreplace(repl), modules=[impls] + N.NUMPY_MODULES)

        def C(a, b, c):
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                out = np.asarray(fn(a, b, c), dtype=float)
            return np.broadcast_to(out, np.broadcast(a, b, c).shape).copy()
        self.C = C

    def C_over_cos(self, q, th):
        """C(q, q, q cos theta)/cos(theta) at arrays q, theta, for odd single-node phi (else None)."""
        if self.single is None:
            return None
        out = np.empty(np.shape(q))
        for qq in np.unique(q):
            sel = q == qq
            out[sel] = polar_eval_over_cos(self.single.coefficients(qq, qq), th[sel])
        return out


def shifted(expr, f, z0=1e-2, order=14):
    """h(z) = phi(z) - phi(0) on float64 arrays (f: phi vectorised, expr: its SymPy expression) without
    cancellation near 0 (its Taylor polynomial for |z| < z0, truncation ~ z0^order; f(z) - phi(0) above),
    or None if SymPy gives no series. The modes m >= 1
    of the polar rule (all that V - C needs) are those of h; from phi itself they lose digits as q -> 0
    (a constant of size phi(0) under a variation of size sqrt(q))."""
    try:
        ser = sp.series(expr, x, 0, order).removeO()
        coeffs = [float(ser.coeff(x, k)) for k in range(1, order)]
        f0 = float(expr.subs(x, 0))
    except Exception:
        return None

    def h(z):
        z = np.asarray(z, dtype=float)
        out = np.asarray(f(z), dtype=float) - f0
        small = np.abs(z) < z0
        if small.any():
            zs, acc = z[small], np.zeros(int(small.sum()))
            for c in reversed(coeffs):
                acc = (acc + c) * zs
            out[small] = acc
        return out
    return h


def rule_distance(f, k):
    """R(theta) = E[(psi(S) - psi(T))^2]/(2 s2) at unit q for psi = phi(max_j u_j), phi homogeneous of
    degree 1 (piecewise linear, kink at 0): on a common piece phi(s) - phi(t) = slope (s - t) with
    s - t = -Rule.dt (no cancellation); R(0) = 2 E[psi'^2] = 2 (a1^2 (1 - 2^-k) + a0^2 2^-k)."""
    a1, a0 = float(f(np.array([1.0]))[0]), -float(f(np.array([-1.0]))[0])

    def one(tv):
        if tv == 0.0:
            return 2.0 * (a1 * a1 * (1.0 - 0.5 ** k) + a0 * a0 * 0.5 ** k)
        s2 = math.sin(0.5 * tv) ** 2
        r = Rule(math.cos(tv), k, 1.0, omc=2.0 * s2)
        s, t = r.s, r.t
        diff = np.where((s > 0) & (t > 0), -a1 * r.dt, np.where((s < 0) & (t < 0), -a0 * r.dt, f(s) - f(t)))
        return float(np.dot(r.w, diff * diff)) / (2.0 * s2)

    def R(q, th):
        th = np.asarray(th, dtype=float)
        return np.array([one(float(tv)) for tv in th.ravel()]).reshape(th.shape)
    return R
