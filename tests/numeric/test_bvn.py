"""The bivariate normal CDF (quadrature.bvn_cdf) against mpmath quadrature of its defining
integral, and the analytic 'no neutrality line' decision against the bracketing scan."""
import math

import mpmath
import numpy as np
import pytest

from symfield.numeric.quadrature import bvn_cdf


def _ref(s, t, c):
    """F(s, t; c) = int_{-inf}^{s} n(x) N((t - c x)/sqrt(1 - c^2)) dx at 30 digits, split at x = 0, t/c."""
    with mpmath.workdps(30):
        s, t, c = mpmath.mpf(s), mpmath.mpf(t), mpmath.mpf(c)
        r = mpmath.sqrt((1 - c) * (1 + c))
        lo = -40
        if s <= lo:
            return 0.0
        pts = sorted({mpmath.mpf(lo), s, *[x for x in ((t / c) if c else None, mpmath.mpf(0)) if x is not None and lo < x < s]})
        # the integrand turns on over a width r around x = t/c: add points there
        if c and lo < t / c < s:
            pts = sorted(set(pts) | {p for p in (t / c + j * r for j in (-8, -2, -0.5, 0.5, 2, 8)) if lo < p < s})
        return float(mpmath.quad(lambda x: mpmath.npdf(x) * mpmath.ncdf((t - c * x) / r), pts))


@pytest.mark.parametrize("n", [pytest.param(150, marks=pytest.mark.slow), 60])
def test_bvn_against_mpmath_random_points(n):
    rng = np.random.default_rng(7)
    s, t = rng.normal(0, 3, n), rng.normal(0, 3, n)
    s[:20], t[20:40] = rng.uniform(-12, 12, 20), rng.uniform(-12, 12, 20)   # large |h|, |k|
    c = rng.uniform(-1, 1, n)
    c[:50] = np.where(rng.random(50) < 0.5, -1, 1) * (1 - 10 ** rng.uniform(-13, -1, 50))  # near +-1
    c[50:60] = rng.choice([-0.925, 0.925, 0.3, -0.3, 0.75, -0.75, 0.0], 10)
    got = np.array([float(bvn_cdf(a, b, r)) for a, b, r in zip(s, t, c)])
    ref = np.array([_ref(a, b, r) for a, b, r in zip(s, t, c)])
    assert np.max(np.abs(got - ref)) <= 1e-14


def test_bvn_edges_and_broadcast():
    from scipy.special import ndtr
    x = np.array([-3.0, -0.5, 0.0, 0.7, 4.0])
    assert np.allclose(bvn_cdf(x, x[::-1], 1.0), ndtr(np.minimum(x, x[::-1])), rtol=0, atol=1e-15)
    assert np.allclose(bvn_cdf(x, x[::-1], -1.0), np.maximum(0, ndtr(x) - ndtr(-x[::-1])), rtol=0, atol=1e-15)
    assert np.allclose(bvn_cdf(x, 2.0, 0.0), ndtr(x) * ndtr(2.0), rtol=0, atol=1e-15)
    assert np.allclose(bvn_cdf(x, np.inf, 0.4), ndtr(x), rtol=0, atol=1e-15) and np.all(bvn_cdf(-np.inf, x, 0.4) == 0)
    assert bvn_cdf(np.zeros((2, 3)), 0.0, 0.5).shape == (2, 3)
    # Sheppard: F(0, 0; c) = 1/4 + arcsin(c)/(2 pi)
    cs = np.array([-0.99, -0.93, -0.5, 0.1, 0.6, 0.95, 0.999999])
    got = np.array([float(bvn_cdf(0.0, 0.0, c)) for c in cs])
    # arcsin is ill-conditioned near 1 (slope 1/sqrt(1 - c^2) ~ 707 at c = 1 - 1e-6): allow for it
    assert np.all(np.abs(got - (0.25 + np.arcsin(cs) / (2 * math.pi))) <= 1e-15 + 2e-16 / np.sqrt(1 - cs * cs) * 100)


@pytest.mark.slow
def test_no_neutrality_decision_matches_scan():
    """relu+max2: rho = C(1, 1, 1/2)/V(1) >= 1/2 decides 'no line'; the residual h is indeed > 0 on a
    q grid; a psi that is not homogeneous (tanh) is still scanned."""
    import symfield as sf
    from symfield.symbolic.kernel import kernel
    from symfield.theory import neutrality as fp
    K = kernel(sf.activation("relu", pool="max", k=2))
    from symfield.numeric.maps import maps
    N = maps(K)
    assert fp.no_neutrality(K, N)
    q = np.geomspace(0.011, 1e6, 40)
    for sb in (0.01, 0.2):
        assert np.all(fp.neutral_residual(N, q[q > sb], sb)[1] > 0)
    sw, qs = fp.neutrality_line(K, np.array([0.05, 0.2]))
    assert np.isnan(sw).all() and np.isnan(qs).all()
    Kt = kernel("tanh")
    assert not fp.no_neutrality(Kt, maps(Kt))


@pytest.mark.slow
def test_array_C_of_max_pool_matches_quadrature_and_dps():
    """Array sf.C of relu+max2 (table path) against the h_k quadrature and the dps=20 maps, and the
    same values as scalar calls."""
    import symfield as sf
    from symfield.numeric.evaluate import evaluate
    from symfield.symbolic.gaussian import q1 as Q1, q2 as Q2, q12 as Q12
    from symfield.symbolic.kernel import kernel
    act = sf.activation("relu", pool="max", k=2)
    K = kernel(act)
    q1, q2 = np.array([0.3, 2.0, 1.0]), np.array([1.7, 0.5, 1.0])
    c = np.array([0.2, -0.9, 0.999]) * np.sqrt(q1 * q2)
    got = sf.C(act, q1, q2, c)
    scale = np.sqrt(sf.V(act, q1) * sf.V(act, q2))
    ref = evaluate(K.C, (Q1, Q2, Q12), (q1, q2, c), K.kinks, None)
    assert np.max(np.abs(got - ref) / scale) <= 1e-10
    mp = sf.C(act, q1, q2, c, dps=20)
    assert max(abs(float(mp[i]) - got[i]) / scale[i] for i in range(3)) <= 1e-10
    assert np.array_equal(got, [sf.C(act, float(a), float(b), float(z)) for a, b, z in zip(q1, q2, c)])
