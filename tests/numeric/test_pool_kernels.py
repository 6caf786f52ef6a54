"""Max- and avg-pool kernels (docs/theory.md section 4): closed forms, declared integrals, identities,
literature constants, argument checks, and every map against Monte Carlo of the 2k-dimensional definition.

Oracles, none of which calls symfield: (a) exact identities and literature constants, (b) seeded Monte
Carlo of the full 2k-dimensional definition, (c) mpmath quadrature of the order-statistic density of M_2.
The order-statistic quadrature of a monotone phi (float64, tables, dps=N): tests/numeric/test_pool_monotone.py;
non-monotone phi (level sets): tests/numeric/test_pool_levelsets.py.
"""
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
from scipy import special as sps

import symfield as sf
from symfield.symbolic import gaussian as G
from conftest import TOL, tol_dps

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12
PHI = {  # numpy phi, phi' and mpmath phi written out by hand
    "relu": (lambda x: np.maximum(x, 0), lambda x: (x > 0) * 1.0, lambda x: x if x > 0 else mp.mpf(0)),
    "tanh": (np.tanh, lambda x: 1 / np.cosh(x) ** 2, mp.tanh),
    "linear": (lambda x: x, lambda x: 1.0 + 0 * x, lambda x: x),
    "erf": (sps.erf, lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x), mp.erf),
}
POINTS = [(1.0, 1.0, 0.5), (0.7, 1.3, -0.5), (2.0, 2.0, 0.99), (0.3, 3.0, 0.2)]


def pool(name, p, k):
    return sf.activation(name, pool=p, k=k)


# ---------------------------------------------------------------- (b) Monte Carlo, 2k dimensions
def mc_pool(name, p, k, q1v, q2v, c, n=100_000, seed=0):
    """Seeded Monte Carlo of (C, V(q1), mean(q1), dpsi2(q1), dC): (mean, standard error) pairs."""
    phi, dphi, _ = PHI[name]
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2, k, n))
    u = math.sqrt(q1v) * z[0]
    v = math.sqrt(q2v) * (c * z[0] + math.sqrt(max(1 - c * c, 0.0)) * z[1])
    if p == "max":
        iu, iv = phi(u).argmax(0), phi(v).argmax(0)
        idx = np.arange(n)
        pu, pv = phi(u)[iu, idx], phi(v)[iv, idx]
        gu, gv = dphi(u[iu, idx]), dphi(v[iv, idx])
        d2, dc = gu**2, gu * gv * (iu == iv)
    else:
        pu, pv = phi(u).mean(0), phi(v).mean(0)
        d2, dc = (dphi(u) ** 2).sum(0) / k**2, (dphi(u) * dphi(v)).sum(0) / k**2
    out = {}
    for key, arr in (("C", pu * pv), ("V", pu**2), ("mean", pu), ("dpsi2", d2), ("dC", dc)):
        out[key] = (arr.mean(), arr.std() / math.sqrt(n))
    return out


MC_CASES = [("relu", "max", 2), ("tanh", "max", 2), ("linear", "max", 2), ("relu", "max", 3), ("erf", "max", 2),
            pytest.param("relu", "max", 4, marks=pytest.mark.slow), ("tanh", "max", 4), ("relu", "avg", 2),
            ("tanh", "avg", 3)]


@pytest.mark.parametrize("name,p,k", MC_CASES)
def test_against_monte_carlo_of_the_2k_dimensional_definition(name, p, k):
    act = pool(name, p, k)
    for i, (a, b, c) in enumerate(POINTS):
        mc = mc_pool(name, p, k, a, b, c, seed=10 * k + i)
        q12v = c * math.sqrt(a * b)
        got = dict(C=sf.C(act, a, b, q12v), V=sf.V(act, a), mean=sf.map_value(act, "mean", a),
                   dpsi2=sf.chi1(act, 1.0, 0.0, q=a), dC=sf.map_value(act, "dC", a, b, q12v))
        for key, (est, se) in mc.items():
            assert abs(got[key] - est) <= TOL["mc_sigmas"] * se + TOL["mc_floor"], \
                (name, p, k, (a, b, c), key, got[key], est, se)


# ---------------------------------------------------------------- (a), (c) closed forms, identities and constants
def test_relu_max2_closed_forms_and_declared_integrals():
    K = sf.kernel(pool("relu", "max", 2))
    assert sp.simplify(K.V - q * (sp.Rational(3, 4) + 1 / (2 * sp.pi))) == 0     # E relu(M_2)^2 = 3/4 + 1/(2 pi)
    assert K.dpsi2 == sp.Rational(3, 4)                                           # P(M_2 > 0)
    assert sp.simplify(K.mean - sp.sqrt(q) * (1 + sp.sqrt(2)) / (2 * sp.sqrt(sp.pi))) == 0
    assert K.C.has(sp.Integral) and not K.closed_form and "h_k" in K.methods["C"]
    assert sf.kernel(pool("relu", "max", 3)).dpsi2 == sp.Rational(7, 8)


def test_order_statistic_constants_vs_mpmath():
    """The k = 2 half-line moments of M_2 and E[relu(M_2)^2] against mpmath quadrature at 30 digits."""
    with mp.workdps(30):
        dens = lambda m: 2 * mp.npdf(m) * mp.ncdf(m)
        for n, (plus, minus) in {1: ((1 + mp.sqrt(2)) / (2 * mp.sqrt(mp.pi)), (1 - mp.sqrt(2)) / (2 * mp.sqrt(mp.pi))),
                                 2: (mp.mpf(3) / 4 + 1 / (2 * mp.pi), mp.mpf(1) / 4 - 1 / (2 * mp.pi))}.items():
            assert abs(mp.quad(lambda m: m**n * dens(m), [0, mp.inf]) - plus) < tol_dps(30, slack=2)
            assert abs(mp.quad(lambda m: m**n * dens(m), [-mp.inf, 0]) - minus) < tol_dps(30, slack=2)
    assert sf.V(pool("relu", "max", 2), 1.0) == pytest.approx(0.75 + 1 / (2 * math.pi), rel=1e-15)


@pytest.mark.parametrize("sw", [0.5, 1.0, 2.3])
def test_slopes_and_reference_constants(sw):
    mx, av = pool("relu", "max", 2), pool("relu", "avg", 2)
    assert sf.q_growth(mx, sw) == pytest.approx(sw * (0.75 + 1 / (2 * math.pi)), rel=TOL["rounding"])
    assert sf.chi1(mx, sw, 0.0, q=1.7) == pytest.approx(0.75 * sw, rel=TOL["rounding"])          # differs from q_growth
    assert sf.q_growth(av, sw) == pytest.approx(sw * (math.pi + 1) / (4 * math.pi), rel=TOL["rounding"])
    assert sf.chi1(av, sw, 0.0, q=1.7) == pytest.approx(sw / 4, rel=TOL["rounding"])
    assert sf.chi1(pool("relu", "max", 3), sw, 0.0, q=0.3) == pytest.approx(7 / 8 * sw, rel=TOL["rounding"])
    # variance criteria (q_growth = 1): 4 pi/(3 pi + 2) for max2, 4 pi/(pi + 1) for avg2
    assert sf.q_growth(mx, 4 * math.pi / (3 * math.pi + 2)) == pytest.approx(1.0, rel=TOL["rounding"])
    assert sf.q_growth(av, 4 * math.pi / (math.pi + 1)) == pytest.approx(1.0, rel=TOL["rounding"])


@pytest.mark.parametrize("k", [2, 3, 5])
def test_tanh_avg_k_equals_tanh_with_sigma_w2_over_k(k):
    act = pool("tanh", "avg", k)
    for qq in (0.05, 1.0, 30.0):
        assert sf.q_map(act, qq, 1.7, 0.1) == pytest.approx(sf.q_map("tanh", qq, 1.7 / k, 0.1), rel=TOL["identity"])
        assert sf.chi1(act, 1.7, 0.1, q=qq) == pytest.approx(sf.chi1("tanh", 1.7 / k, 0.1, q=qq), rel=TOL["identity"])
    for a, b, c in POINTS:
        v = c * math.sqrt(a * b)
        assert sf.qab_map(act, a, b, v, 1.7, 0.1) == pytest.approx(sf.qab_map("tanh", a, b, v, 1.7 / k, 0.1),
                                                            rel=TOL["identity"])


def test_tanh_max2_even_identity():
    """k = 2, even f: E f(M_2) = E f(z): V, dpsi2 (so chi1, q_map) are tanh's exactly; the mean is not 0."""
    K, T = sf.kernel(pool("tanh", "max", 2)), sf.kernel("tanh")
    assert K.V == T.V and K.dpsi2 == T.dpsi2
    assert "even identity" in K.methods["V"]
    for qq in (0.01, 1.0, 100.0):
        assert sf.q_map(pool("tanh", "max", 2), qq, 1.3, 0.05) == sf.q_map("tanh", qq, 1.3, 0.05)
        assert sf.chi1(pool("tanh", "max", 2), 1.3, 0.05, q=qq) == sf.chi1("tanh", 1.3, 0.05, q=qq)
        assert sf.map_value(pool("tanh", "max", 2), "dV", qq) == pytest.approx(sf.map_value("tanh", "dV", qq),
                                                                        rel=TOL["rule_float64"])
    assert sf.map_value(pool("tanh", "max", 2), "mean", 1.0) > 0.3
    erf2 = sf.kernel(pool("erf", "max", 2))
    assert sp.simplify(sp.tan(erf2.mean * sp.pi / 2) ** 2 - q / (1 + q)) == 0      # k=2 split: (2/pi) atan sqrt(q/(1+q))


def test_k1_equals_single_node():
    for name in ("relu", "tanh", "erf"):
        K, S = sf.kernel(pool(name, "max", 1)), sf.kernel(name)
        assert all(sp.simplify(K[m] - S[m]) == 0 for m in ("V", "C", "mean", "dpsi2", "dC", "dV"))
        assert sf.C(pool(name, "max", 1), 0.7, 1.3, 0.4) == sf.C(name, 0.7, 1.3, 0.4)


def test_linear_max2_closed_form_and_c_equals_one():
    K = sf.kernel(pool("linear", "max", 2))
    assert K.closed_form and "|diff|" in K.methods["C"]
    assert sp.simplify(K.C.subs({q1: q, q2: q, q12: q}) - K.V) == 0
    assert sp.simplify(K.C.subs(q12, 0) - sp.sqrt(q1 * q2) / sp.pi) == 0
    assert sp.simplify(K.dC - sp.diff(K.C, q12)) == 0


@pytest.mark.parametrize("name,k", [("relu", 2), ("tanh", 2), pytest.param("relu", 3, marks=pytest.mark.slow), ("erf", 4)])
def test_covariance_limits(name, k):
    """C(q, q, q) = V(q) and C(q1, q2, 0) = mean(q1) mean(q2), also approached at c -> 1."""
    act = pool(name, "max", k)
    for qq in (0.1, 1.0, 10.0):
        V = sf.V(act, qq)
        assert sf.C(act, qq, qq, qq) == pytest.approx(V, rel=TOL["identity"])
        assert abs(sf.C(act, qq, qq, qq * (1 - 1e-12)) - V) <= TOL["quad_float64"] * V
        m = sf.map_value(act, "mean", qq)
        assert sf.C(act, qq, 2 * qq, 0.0) == pytest.approx(m * sf.map_value(act, "mean", 2 * qq), rel=TOL["identity"])
        assert sf.map_value(act, "dC", qq, qq, qq) == pytest.approx(sf.chi1(act, 1.0, 0.0, q=qq),
                                                                   rel=TOL["rule_float64"])


def test_dC_is_the_q12_derivative_of_C():
    for name in ("relu", "tanh"):
        act = pool(name, "max", 2)
        for a, b, c in POINTS[:3]:
            v, h = c * math.sqrt(a * b), 1e-4 * math.sqrt(a * b)
            fd = (sf.C(act, a, b, v + h) - sf.C(act, a, b, v - h)) / (2 * h)
            assert sf.map_value(act, "dC", a, b, v) == pytest.approx(fd, rel=1e-6, abs=1e-8)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,exc,match", [
    (dict(pool="max", k=0), ValueError, r"'k' parameter of activation must be an integer >= 1"),
    (dict(pool="max", k=2.5), (TypeError, ValueError), r"'k' parameter of activation must be an integer"),
    (dict(pool="max", k=9), ValueError, r"'k' parameter of activation"),
    (dict(pool="min", k=2), ValueError, r"'pool' parameter of activation must be one of 'max', 'avg' or None"),
    (dict(pool="Max", k=2), ValueError, r"'pool' parameter"),
])
def test_bad_pool_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        sf.activation("relu", **kw)
