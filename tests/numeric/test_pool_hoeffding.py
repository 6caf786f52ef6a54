"""The float64 max-pool covariance by Hoeffding's identity (symfield.numeric.pool.hoeffding), used by the maps
engine's quadrature of MAX2 integrals for |c| <= C_MAX.

Oracles, none of which uses Hoeffding's identity or the Plackett/Mehler forms of the rule: (a) the exact linear max2
map (max = mean + |diff|/2); (b) relu max2 by Price + Plackett in 4-D orthants (mpmath, test_pool_monotone);
(c) the argmax-decomposition tensor quadrature of the cold benchmark (float64, Owen's T, another formula and other
coordinates); (d) mpmath quadrature of the 1-D law of M_k (c = 0: C is the product of the means); (e) the h_k
density at dps 20 written in test_pool_monotone (slow).
"""
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.numeric.pool import hoeffding as HF
from symfield.numeric.pool import rules
from symfield.numeric.evaluate import NUMPY_MODULES, vectorised
from symfield.reports.bench_cold import max2_C
from symfield.symbolic.formula import X
from symfield.symbolic.integrals import Integrand, Kind
from conftest import TOL
from test_pool_monotone import mp_max1, mp_max2, relu_max2_oracle

TANH2 = sf.activation("tanh", pool="max", k=2)
SECH2 = lambda x: 1 / np.cosh(x) ** 2          # noqa: E731
ONE = lambda x: 1.0 + 0 * x                    # noqa: E731
STEP = lambda x: (x > 0) * 1.0                 # noqa: E731


def scale_tanh(a, b, k=2):
    return math.sqrt(float(sf.V(sf.activation("tanh", pool="max", k=k), a) * sf.V(sf.activation("tanh", pool="max", k=k), b)))


@pytest.mark.parametrize("a,b,c", [(1.0, 2.0, 0.5), (0.3, 2.7, -0.9), (1e-3, 1e3, 0.3), (50.0, 0.02, 0.925),
                                   (4.0, 9.0, -0.92), (0.5, 0.6, 1e-3)])
def test_linear_vs_exact(a, b, c):
    """f = g = x (f' = 1): C = q12/2 + sqrt(q1 q2) (sqrt(1 - c^2) + c asin c)/pi exactly (both the Mehler and the
    Plackett branch: |c| on either side of MEHLER_C)."""
    q12 = c * math.sqrt(a * b)
    got = HF.Max2(ONE, ONE, 0.0, 0.0, 2)(a, b, q12)
    with mp.workdps(30):
        cc = mp.mpf(q12) / mp.sqrt(mp.mpf(a) * b)
        exact = mp.mpf(q12) / 2 + mp.sqrt(mp.mpf(a) * b) * (mp.sqrt(1 - cc * cc) + cc * mp.asin(cc)) / mp.pi
    assert abs(got - float(exact)) <= TOL["rule_float64"] * math.sqrt(a * b), (got, exact)


@pytest.mark.parametrize("a,b,c", [(0.7, 1.3, "0.5"), (2.0, 0.05, "-0.8"), (0.1, 10.0, "0.92")])
def test_relu_vs_plackett(a, b, c):
    """relu (f' a step, kink at 0): C = sqrt(q1 q2) Gamma(c), Gamma from 4-D orthant probabilities (mpmath)."""
    with mp.workdps(20):
        G, _ = relu_max2_oracle(mp.mpf(c))
    q12 = float(c) * math.sqrt(a * b)
    got = HF.Max2(STEP, STEP, 0.0, 0.0, 2, kinks=(0.0,))(a, b, q12)
    scale = math.sqrt(a * b) * (0.75 + 1 / (2 * math.pi))
    assert abs(got - math.sqrt(a * b) * float(G)) <= TOL["rule_float64"] * scale


def test_tanh_scalar_C_vs_argmax_oracle():
    """sf.C of tanh+max2 at unequal norms (the engine's quadrature path, here Hoeffding's rule) against the
    argmax-decomposition tensor quadrature (Owen's T; converged to ~1e-15 at |c| <= 0.9)."""
    rng = np.random.default_rng(3)
    for _ in range(6):
        a = rng.uniform(0.2, 3.0)
        b = a * rng.uniform(1.2, 4.0)
        q12 = rng.uniform(-0.9, 0.9) * math.sqrt(a * b)
        got = float(sf.C(TANH2, a, b, q12))
        ref = max2_C(np.tanh, a, b, q12, nodes=16)
        assert abs(got - ref) <= TOL["rule_float64"] * scale_tanh(a, b), (a, b, q12, got - ref)


@pytest.mark.parametrize("k", [2, 3])
def test_means_at_c_zero_vs_mpmath(k):
    """c = 0: C = E[tanh(M_u)] E[tanh(M_v)], each mean by mpmath quadrature of the 1-D law of M_k."""
    rule = HF.Max2(SECH2, SECH2, 0.0, 0.0, k)
    for a, b in [(0.04, 0.5), (1.3, 30.0)]:
        ref = mp_max1(mp.tanh, k, a, dps=20) * mp_max1(mp.tanh, k, b, dps=20)
        assert abs(rule(a, b, 0.0) - float(ref)) <= TOL["rule_float64"] * scale_tanh(a, b, k)


def test_k3_vs_h_k_quadrature():
    """k = 3 (the Plackett branch, D = F^3 - (N N)^3) against max_expect2's h_k density rule, another construction."""
    from symfield.numeric.quadrature import max_expect2
    rule = HF.Max2(SECH2, SECH2, 0.0, 0.0, 3)
    for a, b, c in [(0.8, 2.0, 0.3), (3.0, 0.5, -0.85)]:
        q12 = c * math.sqrt(a * b)
        ref = max_expect2(np.tanh, np.tanh, a, b, q12, 3)
        assert abs(rule(a, b, q12) - ref) <= TOL["rule_float64"] * scale_tanh(a, b, 3)


@pytest.mark.slow
def test_tanh_vs_mpmath_h_k_density():
    """(e): the h_k density at dps 20 (~2 min)."""
    a, b, c = 0.9, 2.5, 0.85
    ref = mp_max2(mp.tanh, mp.tanh, a, b, c)
    got = float(sf.C(TANH2, a, b, c * math.sqrt(a * b)))
    assert abs(got - float(ref)) <= TOL["quad_float64"] * scale_tanh(a, b)


def test_engine_routes_max2_to_hoeffding_up_to_c_max(monkeypatch):
    """The engine's C at unequal norms calls no h_k quadrature for |c| <= C_MAX, and does above it."""
    calls = []

    def spy(*args, **kw):
        calls.append(args[2:5])
        return 0.5
    monkeypatch.setattr(rules, "max_expect2", spy)
    a, b = 0.77, 1.91
    sf.C(TANH2, a, b, 0.9 * math.sqrt(a * b))
    sf.C(TANH2, np.array([a, a]), b, np.array([-0.3, 0.6]) * math.sqrt(a * b))
    assert not calls
    assert float(sf.C(TANH2, a, b, 0.97 * math.sqrt(a * b))) == 0.5 and len(calls) == 1


def test_non_finite_rule_falls_back(monkeypatch):
    """A non-finite value of the rule is never returned: the h_k quadrature answers instead."""
    monkeypatch.setattr(rules, "max_expect2", lambda *a, **k: 0.25)
    assert rules._max2_f64(lambda *a: math.nan, None, None, 1.0, 2.0, 0.1, 2, ()) == 0.25


@pytest.mark.parametrize("f", [sp.exp(X), sp.Heaviside(X), 1 / (X - sp.Rational(1, 2))])
def test_refused_integrands(f):
    """f' growing exponentially, f' a Dirac delta (a jump), f' not finite on [-40, 40]: no Hoeffding rule."""
    spec = Integrand(Kind.MAX2, f, f, 2)
    assert rules._hoeffding(spec, (), vectorised, NUMPY_MODULES) is None
