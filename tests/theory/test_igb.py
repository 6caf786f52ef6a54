"""Initial guessing bias (docs/theory.md section 10): G0 density, sampler, variance, C-class fractions."""
import math

import mpmath as mp
import numpy as np
import pytest
from scipy import integrate, stats

from symfield import igb

GAMMAS = [0.1, 0.5, 1.0, 2.0, 10.0]


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("gamma", GAMMAS)
def test_pdf_integrates_to_one(gamma):
    # symmetric about 1/2; with g = Phi(t) the integrand p(Phi(t)) phi(t) is smooth (tail below -30 < 1e-20)
    val = 2 * integrate.quad(lambda t: igb.g0_pdf(stats.norm.cdf(t), gamma) * stats.norm.pdf(t), -30, 0)[0]
    assert val == pytest.approx(1.0, abs=1e-10)
    # direct on (0, 1/2]; for gamma > 1 the integrable singularity at g = 0 limits quad's accuracy
    direct = 2 * integrate.quad(igb.g0_pdf, 0, 0.5, args=(gamma,), limit=200)[0]
    assert direct == pytest.approx(1.0, abs=1e-10 if gamma <= 1 else 2e-6)


def test_pdf_shapes():
    g = np.linspace(0, 1, 101)
    assert np.array_equal(igb.g0_pdf(g, 1.0), np.ones_like(g))          # uniform exactly at gamma = 1
    for gamma in [0.1, 0.5, 0.9]:                                         # neutral: single peak at 1/2
        p = igb.g0_pdf(g, gamma)
        assert np.argmax(p) == 50 and np.all(np.diff(p[:51]) > 0) and np.all(np.diff(p[50:]) < 0)
        assert igb.g0_pdf(0.5, gamma) > igb.g0_pdf(0.01, gamma)
        assert igb.g0_pdf(0.0, gamma) == 0.0 and igb.g0_pdf(1.0, gamma) == 0.0
    for gamma in [1.5, 2.0, 10.0]:                                        # prejudice: mass at 0 and 1
        assert igb.g0_pdf(0.5, gamma) < igb.g0_pdf(0.01, gamma)
        assert igb.g0_pdf(0.0, gamma) == np.inf and igb.g0_pdf(1.0, gamma) == np.inf
        assert igb.g0_pdf(0.5, gamma) == pytest.approx(gamma ** -0.5, rel=1e-15)


def test_pdf_against_erfinv_formula():
    for gamma in GAMMAS:
        for g in [1e-6, 0.03, 0.4, 0.77, 1 - 1e-9]:
            ref = mp.power(gamma, -0.5) * mp.exp((1 - 1 / mp.mpf(gamma)) * mp.erfinv(2 * mp.mpf(g) - 1) ** 2)
            assert igb.g0_pdf(g, gamma) == pytest.approx(float(ref), rel=1e-9)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("gamma", [0.1, 1.0, 10.0])
def test_sampler_matches_cdf(gamma):
    s = igb.g0_sample(gamma, 20000, seed=7)
    assert s.shape == (20000,) and np.all((s >= 0) & (s <= 1))
    assert stats.kstest(s, lambda x: igb.g0_cdf(x, gamma)).pvalue > 1e-3
    assert np.array_equal(s, igb.g0_sample(gamma, 20000, seed=7))         # seeded
    # cdf is the integral of the pdf
    assert igb.g0_cdf(0.3, gamma) == pytest.approx(integrate.quad(igb.g0_pdf, 0, 0.3, args=(gamma,))[0], rel=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 0.1, 1.0, 3.0, 10.0])
def test_g0_var(gamma):
    v = igb.g0_var(gamma)
    assert igb.g0_mean(gamma) == 0.5
    a = mp.sqrt(gamma)
    ref = mp.quad(lambda z: mp.ncdf(a * z) ** 2 * mp.npdf(z), [-mp.inf, 0, mp.inf]) - mp.mpf(1) / 4
    assert v == pytest.approx(float(ref), rel=1e-12, abs=1e-15)
    assert v == pytest.approx(igb.g0_moment(2, gamma) - 0.25, rel=1e-10, abs=1e-15)
    s = igb.g0_sample(gamma, 20000, seed=3)
    se = np.sqrt(np.mean((s - 0.5) ** 4) / len(s)) + 1e-12                # standard error of the variance
    assert abs(np.var(s) - v) < 6 * se
    assert igb.g0_var(1.0) == pytest.approx(1 / 12, rel=1e-15) and igb.g0_var(np.inf) == 0.25


def test_moments():
    assert igb.g0_moment(0, 2.0) == pytest.approx(1.0, rel=1e-14)
    assert igb.g0_moment(1, 2.0) == pytest.approx(0.5, rel=1e-14)
    assert igb.g0_moment(3, 1.0) == pytest.approx(0.25, rel=1e-12)        # uniform: 1/(n+1)
    assert igb.g0_moment(4, 1.0) == pytest.approx(0.2, rel=1e-12)
    for gamma in [0.3, 5.0, 1e4]:   # against mpmath quadrature of the defining integral
        a = mp.sqrt(gamma)
        ref = mp.quad(lambda z: mp.ncdf(a * z) ** 5 * mp.npdf(z), [-mp.inf, -1 / a, 0, 1 / a, mp.inf])
        assert igb.g0_moment(5, gamma) == pytest.approx(float(ref), rel=1e-11)
    assert np.allclose(igb.g0_moment(2, [0.5, 10.0]) - 0.25, igb.g0_var([0.5, 10.0]), rtol=1e-11)
    assert igb.g0_moment(3, 0.0) == pytest.approx(0.125, rel=1e-14)


def test_c_gamma_round_trips():
    g = np.array([0.0, 1e-8, 0.3, 1.0, 7.5, 1e6])
    assert np.allclose(igb.gamma_from_c(igb.c_from_gamma(g)), g, rtol=1e-9, atol=0)
    c = np.linspace(0, 0.99, 34)
    assert np.allclose(igb.c_from_gamma(igb.gamma_from_c(c)), c, rtol=1e-14, atol=0)
    assert igb.gamma_from_c(1.0) == np.inf and igb.c_from_gamma(np.inf) == 1.0
    assert igb.gamma_from_c(0.5) == 1.0 and igb.c_from_gamma(1.0) == 0.5


def test_bridge_q():
    sigma_mu2, sigma_y2 = np.array([0.0, 0.2, 1.5, 3.0]), np.array([1.0, 0.8, 0.5, 2.0])
    q_aa, q_ab = sigma_mu2 + sigma_y2, sigma_mu2
    assert np.allclose(igb.gamma_from_q(q_aa, q_ab), sigma_mu2 / sigma_y2, rtol=1e-14)
    mu, y = igb.sigmas_from_q(q_aa, q_ab)
    assert np.allclose(mu, sigma_mu2) and np.allclose(y, sigma_y2)
    assert np.allclose(igb.c_from_gamma(igb.gamma_from_q(q_aa, q_ab)), q_ab / q_aa, rtol=1e-14)
    assert igb.gamma_from_q(2.0, 2.0) == np.inf


@pytest.mark.parametrize("gamma,C", [(0.0, 3), (0.1, 2), (1.0, 5), (10.0, 10)])
def test_gc_fractions_sum_to_one(gamma, C):
    G = igb.gc_sample(gamma, C, 500, seed=1)
    assert G.shape == (500, C) and np.all(G >= 0)
    assert np.max(np.abs(G.sum(axis=1) - 1)) < 1e-8
    assert np.mean(G) == pytest.approx(1 / C, rel=1e-9)
    if gamma == 0:
        assert np.allclose(G, 1 / C, rtol=1e-9)


def test_gc_many_classes_higher_order():
    G = igb.gc_sample(0.01, 100, 20, seed=2, order=250)
    assert np.max(np.abs(G.sum(axis=1) - 1)) < 1e-9


@pytest.mark.parametrize("gamma", [0.1, 1.0, 10.0])
def test_gc_two_classes_is_g0(gamma):
    G = igb.gc_sample(gamma, 2, 20000, seed=11)
    # G_0 = Phi(sqrt(gamma)(Z_0 - Z_1)/sqrt(2)), same law as G0
    assert stats.kstest(G[:, 0], lambda x: igb.g0_cdf(x, gamma)).pvalue > 1e-3
    assert stats.kstest(G[:, 1], lambda x: igb.g0_cdf(x, gamma)).pvalue > 1e-3


@pytest.mark.parametrize("call,exc,match", [
    (lambda: igb.gamma_from_c(-0.1), ValueError, r"'c' parameter of gamma_from_c must be a finite float >= 0 and <= 1\. Got -0\.1"),
    (lambda: igb.gamma_from_c(1.5), ValueError, r"'c' parameter of gamma_from_c .* Got 1\.5"),
    (lambda: igb.gamma_from_c("0.5"), TypeError, r"'c' parameter of gamma_from_c"),
    (lambda: igb.c_from_gamma(-1.0), ValueError, r"'gamma' parameter of c_from_gamma must be .* >= 0\. Got -1\.0"),
    (lambda: igb.c_from_gamma(math.nan), ValueError, r"'gamma' parameter of c_from_gamma .* Got nan"),
    (lambda: igb.g0_pdf(1.2, 1.0), ValueError, r"'g' parameter of g0_pdf .* Got 1\.2"),
    (lambda: igb.g0_pdf(-0.1, 1.0), ValueError, r"'g' parameter of g0_pdf .* Got -0\.1"),
    (lambda: igb.g0_pdf(0.5, -2.0), ValueError, r"'gamma' parameter of g0_pdf .* Got -2\.0"),
    (lambda: igb.g0_pdf(0.5, 0.0), ValueError, r"'gamma' parameter of g0_pdf must be a finite float > 0.*point mass"),
    (lambda: igb.g0_pdf(0.5, math.inf), ValueError, r"'gamma' parameter of g0_pdf .* Got inf"),
    (lambda: igb.g0_sample(1.0, 0, 0), ValueError, r"'size' parameter of g0_sample must be an integer >= 1\. Got 0"),
    (lambda: igb.g0_sample(1.0, 2.5, 0), TypeError, r"'size' parameter of g0_sample must be an integer"),
    (lambda: igb.g0_sample(-1.0, 5, 0), ValueError, r"'gamma' parameter of g0_sample"),
    (lambda: igb.g0_sample(1.0, 5, -3), ValueError, r"'seed' parameter of g0_sample"),
    (lambda: igb.g0_var(-0.5), ValueError, r"'gamma' parameter of g0_var .* Got -0\.5"),
    (lambda: igb.g0_moment(-1, 1.0), ValueError, r"'n' parameter of g0_moment must be an integer >= 0"),
    (lambda: igb.gamma_from_q(1.0, 2.0), ValueError, r"'q_ab' parameter of gamma_from_q must be <= q_aa.* Got 2\.0"),
    (lambda: igb.gamma_from_q(0.0, 0.0), ValueError, r"'q_aa' parameter of gamma_from_q must be a finite float > 0"),
    (lambda: igb.sigmas_from_q(1.0, -0.1), ValueError, r"'q_ab' parameter of sigmas_from_q .* Got -0\.1"),
    (lambda: igb.gc_sample(1.0, 1, 10, 0), ValueError, r"'n_classes' parameter of gc_sample must be an integer >= 2"),
    (lambda: igb.gc_sample(1.0, 3, 5, 0, order=2), ValueError, r"'order' parameter of gc_sample must be an integer >= 8"),
    (lambda: igb.gc_sample(1.0, 3, 0, 0), ValueError, r"'size' parameter of gc_sample must be an integer >= 1"),
])
def test_bad_inputs(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
