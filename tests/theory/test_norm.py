"""Normalisation layers (docs/theory.md section 12) against independent oracles: mpmath quadratures of the
defining Gaussian and sphere integrals written here, closed forms derived by hand, and seeded networks with
real LayerNorm / BatchNorm (the BatchNorm gradients are backpropagated here through the exact BN Jacobian)."""
import math

import mpmath
import numpy as np
import pytest

import symfield as sf


# ---------------------------------------------------------------- oracles
def gauss1(f, dps=20):
    """E[f(z)], z ~ N(0, 1), by mpmath quadrature."""
    with mpmath.workdps(dps):
        return mpmath.quad(lambda z: f(z) * mpmath.exp(-z * z / 2), [-mpmath.inf, 0, mpmath.inf]) / mpmath.sqrt(2 * mpmath.pi)


def gauss2(f, q1, q2, c, dps=12):
    """E[f(u, v)] for (u, v) Gaussian with variances q1, q2 and correlation c (double mpmath quadrature)."""
    with mpmath.workdps(dps):
        s1, s2, r = mpmath.sqrt(q1), mpmath.sqrt(q2), mpmath.sqrt(1 - mpmath.mpf(c) ** 2)
        g = lambda z: mpmath.exp(-z * z / 2) / mpmath.sqrt(2 * mpmath.pi)  # noqa: E731

        def inner(a):     # split where v = 0 (the kink of relu), b = -c a / r
            return g(a) * mpmath.quad(lambda b: f(s1 * a, s2 * (c * a + r * b)) * g(b), [-12, -c * a / r, 12])
        return mpmath.quad(inner, [-12, 0, 12])


relu = lambda t: max(t, 0)  # noqa: E731


# ---------------------------------------------------------------- LayerNorm
def test_layernorm_before_tanh_is_chaotic_at_zero_bias_for_every_weight():
    oracle = gauss1(lambda z: mpmath.sech(z) ** 4) / gauss1(lambda z: mpmath.tanh(z) ** 2)
    assert abs(float(oracle) - 1.177807232304179) < 1e-14
    for sw in (0.3, 1.0, 4.0):
        assert float(sf.chi1("tanh", sw, 0.0, norm="layer")) == pytest.approx(float(oracle), rel=1e-12)
        assert sf.phase("tanh", sw, 0.0, norm="layer") in ("prejudice", "neutrality")


def test_layernorm_before_eoc_ray_of_tanh_to_25_digits():
    with mpmath.workdps(45):
        r = gauss1(lambda z: mpmath.sech(z) ** 4, 45) - gauss1(lambda z: mpmath.tanh(z) ** 2, 45)
        e = sf.eoc("tanh", 0.1, norm="layer", dps=30)
        assert abs(e.ratio - r) < mpmath.mpf(10) ** -25 * abs(r)
        assert abs(e.sigma_w2 - mpmath.mpf("0.1") / r) < mpmath.mpf(10) ** -24
    # on the ray chi1 = 1; below it (smaller sigma_b2) chaotic, above ordered
    sw = float(e.sigma_w2)
    assert float(sf.chi1("tanh", sw, 0.1, norm="layer")) == pytest.approx(1.0, abs=1e-12)
    assert sf.phase("tanh", sw, 0.2, norm="layer") == "ordered-deep-prejudice"


@pytest.mark.parametrize("act,f", [pytest.param("tanh", mpmath.tanh, marks=pytest.mark.slow), ("relu", relu)])
def test_layernorm_maps_against_quadrature(act, f):
    sw, sb, q1, q2, q12 = 1.7, 0.2, 2.0, 0.5, 0.6
    c = q12 / math.sqrt(q1 * q2)
    V1 = gauss1(lambda z: f(z) ** 2)
    before = sw * gauss2(lambda u, v: f(u) * f(v), 1, 1, c) + sb
    assert float(sf.q_map(act, q1, sw, sb, norm="layer")) == pytest.approx(float(sw * V1 + sb), rel=1e-10)
    assert float(sf.qab_map(act, q1, q2, q12, sw, sb, norm="layer")) == pytest.approx(float(before), rel=1e-9)
    m = [gauss1(lambda z: f(mpmath.sqrt(q) * z)) for q in (q1, q2)]
    s = [mpmath.sqrt(gauss1(lambda z: f(mpmath.sqrt(q) * z) ** 2) - mm ** 2) for q, mm in zip((q1, q2), m)]
    chat = (gauss2(lambda u, v: f(u) * f(v), q1, q2, c) - m[0] * m[1]) / (s[0] * s[1])
    assert float(sf.qab_map(act, q1, q2, q12, sw, sb, norm="layer", norm_at="after")) == pytest.approx(
        float(sw * chat + sb), rel=1e-9)
    assert float(sf.q_map(act, q1, sw, sb, norm="layer", norm_at="after")) == pytest.approx(sw + sb, rel=1e-15)


def test_layernorm_after_keeps_one_minus_c_near_one():
    """relu: 1 - c_hat = (V - C)/(V - m^2) from the arc-cosine kernel at 50 digits (c = 1 - 1e-12)."""
    sw, d0 = 2.0, 1e-12
    p = sf.propagate("relu", sw, 0.0, depth=2, q0=1.0, qab0=1.0, d0=d0, norm="layer", norm_at="after")
    with mpmath.workdps(50):
        c = 1 - mpmath.mpf(d0) / 2       # layer 1: q = sw, d = sw d0, c = 1 - d0/2
        C = (mpmath.sqrt(1 - c * c) + (mpmath.pi - mpmath.acos(c)) * c) / (2 * mpmath.pi)
        gap = (mpmath.mpf(1) / 2 - C) / (mpmath.mpf(1) / 2 - 1 / (2 * mpmath.pi))
    assert p.d[1] == pytest.approx(float(2 * sw * gap), rel=1e-9)
    assert p.one_minus_c[1] == pytest.approx(float(gap), rel=1e-9)


def test_layernorm_after_relu_is_neutral_at_zero_bias():
    ph = sf.phase("relu", 2.0, 0.0, norm="layer", norm_at="after", full=True)
    assert ph.label == "neutrality" and abs(ph.c_star) < 1e-12 and ph.slope == pytest.approx(math.pi / (math.pi - 1))
    p = sf.propagate("relu", 2.0, 0.0, depth=12, qab0=0.3, norm="layer", norm_at="after")
    slope0 = 0.25 / (0.5 - 1 / (2 * math.pi))       # d c_hat/dc at c = 0: E[relu']^2/Var relu
    assert np.all(np.diff(p.c[1:]) < 0) and 0 < p.c[-1] < 0.1 * p.c[1]
    assert p.c[-1] / p.c[-2] == pytest.approx(slope0, rel=0.02)       # c -> 0 at the rate of the c-map's slope


def test_layernorm_after_eoc_of_relu_is_a_line():
    """relu after phi: chi1 = sigma_w2 pi/((pi - 1)(sigma_w2 + sigma_b2)) = 1 at sigma_w2 = (pi - 1) sigma_b2."""
    e = sf.eoc("relu", 0.3, norm="layer", norm_at="after")
    assert e.sigma_w2 == pytest.approx((math.pi - 1) * 0.3, rel=1e-12)


def test_phase_diagram_under_layernorm_draws_the_ray():
    r = gauss1(lambda z: mpmath.sech(z) ** 4) - gauss1(lambda z: mpmath.tanh(z) ** 2)
    d = sf.phase_diagram("tanh", [0.5, 3.0], [0.0, 0.1], norm="layer")
    assert d.eoc[1] == pytest.approx(float(0.1 / r), rel=1e-10) and d.eoc[0] == 0.0
    assert d.labels[1, 1] != "ordered-deep-prejudice" and d.labels[0, 1] == "ordered-deep-prejudice"
    # relu before LayerNorm at sigma_b2 = 0: chi1 = sigma_w2/2/(sigma_w2/2) = 1 exactly, c* = 1
    assert sf.phase("relu", 2.5, 0.0, norm="layer") == "edge-of-chaos"
    assert sf.phase("relu", 2.5, 0.1, norm="layer") == "ordered-deep-prejudice"


PLACEMENTS = [("layer", "before"), ("layer", "after"), ("batch", "before"), ("batch", "after")]


def _cmap_vs_networks(act, norm, at, sw, sb, width, n_networks, P):
    sim = sf.simulate(act, width, 4, sw, sb, n_inputs=P, n_networks=n_networks, seed=7, norm=norm, norm_at=at)
    theory = sf.propagate(act, sw, sb, depth=4, norm=norm, norm_at=at, batch=P if norm == "batch" else None).c
    se = sim.networks.c.std(axis=0, ddof=1) / math.sqrt(n_networks)
    return theory, sim.c, se


@pytest.mark.parametrize("norm,at", PLACEMENTS)
@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_cmap_against_networks_small(act, norm, at):
    theory, mean, se = _cmap_vs_networks(act, norm, at, 1.5, 0.1, 600, 8, 4)
    z = np.abs(mean - theory)[1:] / se[1:]
    assert np.all(z < 4), (theory, mean, se)


@pytest.mark.slow
@pytest.mark.parametrize("norm,at", PLACEMENTS)
@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_cmap_against_networks_width_2000(act, norm, at):
    theory, mean, se = _cmap_vs_networks(act, norm, at, 1.5, 0.1, 2000, 16, 8)
    assert np.all(np.abs(mean - theory)[1:] <= 3 * se[1:]), (theory, mean, se)


# ---------------------------------------------------------------- BatchNorm
def test_batchnorm_rate_limits():
    assert sf.batchnorm("relu", 2.0, 0.0).rate == pytest.approx(math.pi / (math.pi - 1), rel=1e-13)
    assert sf.batchnorm("linear", 1.0, 0.3).rate == pytest.approx(1.0, rel=1e-13)
    for B in (4, 5, 8, 33):   # linear: [(B-1) + E x1 x2 - E x^2 + E x1 x2 ...] reduces to (B-2)/(B-3)
        assert sf.batchnorm("linear", 1.0, 0.0, B).rate == pytest.approx((B - 2) / (B - 3), rel=1e-12)
    assert sf.batchnorm("relu", 1.0, 0.0, 3).rate == math.inf
    tanh_inf = gauss1(lambda z: mpmath.sech(z) ** 4) / gauss1(lambda z: mpmath.tanh(z) ** 2)
    assert sf.batchnorm("tanh", 1.0, 0.0).rate == pytest.approx(float(tanh_inf), rel=1e-10)


def _sphere_samples(B, n, seed):
    """x = sqrt(B) P g/|P g| (uniform on the sphere of radius sqrt(B) in 1^perp)."""
    g = np.random.default_rng(seed).standard_normal((n, B))
    g -= g.mean(axis=1, keepdims=True)
    return math.sqrt(B) * g / np.linalg.norm(g, axis=1, keepdims=True)


@pytest.mark.parametrize("B", [4, 8])
def test_batchnorm_fixed_point_against_sphere_monte_carlo(B):
    x = _sphere_samples(B, 400_000, B)
    t = np.tanh(x)
    Gd, God = (t[:, 0] ** 2), t[:, 0] * t[:, 1]
    r = sf.batchnorm("tanh", 1.3, 0.2, B)
    assert abs(r.q_star - (1.3 * Gd.mean() + 0.2)) < 4 * 1.3 * Gd.std() / math.sqrt(Gd.size)
    assert abs(r.q_ab_star - (1.3 * God.mean() + 0.2)) < 4 * 1.3 * God.std() / math.sqrt(God.size)
    # the x1 marginal density is proportional to (1 - x^2/(B-1))^((B-4)/2): an independent 1-D quadrature
    R = mpmath.sqrt(B - 1)
    w = lambda s: (1 - s * s / (B - 1)) ** (mpmath.mpf(B - 4) / 2)  # noqa: E731
    Gd_q = mpmath.quad(lambda s: mpmath.tanh(s) ** 2 * w(s), [-R, 0, R]) / mpmath.quad(w, [-R, 0, R])
    assert r.q_star == pytest.approx(float(1.3 * Gd_q + 0.2), rel=1e-10)


def test_batchnorm_after_closed_form():
    """After phi: sum_a y_a = 0 and sum_a y_a^2 = B give E y_a^2 = 1, E y_a y_b = -1/(B-1)."""
    r = sf.batchnorm("gelu", 1.5, 0.2, 6, norm_at="after")
    assert r.q_star == pytest.approx(1.7) and r.q_ab_star == pytest.approx(0.2 - 1.5 / 5)
    assert r.gamma == pytest.approx((0.2 - 0.3) / (1.5 * 6 / 5))


def bn_rate_networks(act, B, width=800, depth=20, n_networks=6, skip=5, seed=0):
    """Per-layer growth of the squared gradient norm in seeded BatchNorm networks (BN before phi): forward
    h -> x = (h - mean_a h)/std_a h -> phi(x) -> W . + b, then backward through the exact BN Jacobian
    g_h = (g_x - mean_a g_x - x mean_a(g_x x))/std_a h. The rate is the mean of |g^(l)|^2/|g^(l+1)|^2 over
    the layers after ``skip`` (before the step into layer 1, whose (q, c) are the inputs'): a ratio of
    expectations, as lambda_B is (at B = 4 the per-unit factor 1/std^2 has infinite variance, and a fit of
    log |g|^2 would estimate the smaller typical rate); returns (mean, standard error) over networks."""
    phi, dphi = {"relu": (lambda v: np.maximum(v, 0), lambda v: (v > 0) * 1.0),
                 "linear": (lambda v: v, np.ones_like),
                 "tanh": (np.tanh, lambda v: 1 / np.cosh(v) ** 2),
                 "gelu": (lambda v: v * _Phi(v), lambda v: _Phi(v) + v * np.exp(-v * v / 2) / math.sqrt(2 * math.pi))}[act]
    rates = []
    for child in np.random.SeedSequence(seed).spawn(n_networks):
        rng = np.random.default_rng(child)
        X = np.linalg.qr(rng.standard_normal((width, B)))[0].T * math.sqrt(width)      # orthonormal inputs
        Ws = [rng.standard_normal((width, width)) * math.sqrt(2.0 / width) for _ in range(depth)]
        h, cache = X @ Ws[0].T + 0.1 * rng.standard_normal(width), []
        for W in Ws[1:]:
            z = h - h.mean(0)
            sd = np.sqrt((z * z).mean(0))
            x = z / sd
            cache.append((x, sd))
            h = phi(x) @ W.T + 0.1 * rng.standard_normal(width)
        g, norms = rng.standard_normal(h.shape), []
        for W, (x, sd) in zip(Ws[:0:-1], cache[::-1]):
            gx = (g @ W) * dphi(x)
            g = (gx - gx.mean(0) - x * (gx * x).mean(0)) / sd
            norms.append((g * g).sum())
        norms = np.array(norms)[skip:-1]     # the last step reaches layer 1, at the inputs' (q, c)
        rates.append(float(np.mean(norms[1:] / norms[:-1])))
    return float(np.mean(rates)), float(np.std(rates, ddof=1) / math.sqrt(n_networks))


def _Phi(v):
    from scipy.special import ndtr
    return ndtr(v)


@pytest.mark.parametrize("act", ["relu", "tanh"])
def test_batchnorm_gradient_rate_against_networks_small(act):
    mean, se = bn_rate_networks(act, 8, width=500, depth=14, n_networks=6)
    assert abs(mean - sf.batchnorm(act, 2.0, 0.1, 8).rate) <= 3 * se + 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("B", [4, 8, 32, 128, None])
@pytest.mark.parametrize("act", ["relu", "tanh", "gelu", "linear"])
def test_batchnorm_gradient_rate_against_networks(act, B):
    """The networks' rate has a finite-width deficit of order B/n (linear, B = 32: -0.0037 at n = 400,
    -0.0035 at n = 1600 (-4 se), -0.0009 at n = 3200; linear B = 256 at n = 3200 still -3 se), so B >= 32
    runs at width 3200; B = None is checked through B = 128 (width 3200) against lambda_128, with lambda_128 within
    0.015 of the limit E[phi'^2]/Var phi."""
    if B is None:
        assert abs(sf.batchnorm(act, 2.0, 0.1, 128).rate - sf.batchnorm(act, 2.0, 0.1).rate) < 0.015
        B = 128
    if B >= 32:
        mean, se = bn_rate_networks(act, B, width=3200, depth=10 if B >= 128 else 12, skip=3, n_networks=6)
    else:
        mean, se = bn_rate_networks(act, B, width=800, n_networks=6)
    assert abs(mean - sf.batchnorm(act, 2.0, 0.1, B).rate) <= 3 * se


@pytest.mark.parametrize("act,f,df", [
    ("tanh", mpmath.tanh, lambda t: mpmath.sech(t) ** 2),
    ("gelu", lambda t: t * mpmath.ncdf(t), lambda t: mpmath.ncdf(t) + t * mpmath.npdf(t))])
def test_batchnorm_after_rate_at_infinite_batch_against_quadrature(act, f, df):
    """BatchNorm after phi, B -> inf: the batch mean and standard deviation of phi(h) are constants, so the
    squared gradient grows by sigma_w2 E[phi'(h)^2]/Var phi(h) per layer, h ~ N(0, sigma_w2 + sigma_b2)."""
    sw, sb = 1.7, 0.2
    s = mpmath.sqrt(sw + sb)
    m, v = gauss1(lambda z: f(s * z)), gauss1(lambda z: f(s * z) ** 2)
    want = sw * gauss1(lambda z: df(s * z) ** 2) / (v - m * m)
    got = sf.chi1(act, sw, sb, norm="batch", norm_at="after")
    assert abs(got - float(want)) <= 1e-12 * float(want)
    assert sf.batchnorm(act, sw, sb, norm_at="after").rate == pytest.approx(float(got), rel=1e-14)
    assert math.isnan(sf.batchnorm(act, sw, sb, batch=8, norm_at="after").rate)


def test_batchnorm_after_relu_rate_at_infinite_batch_closed_form():
    """relu: sigma_w2 (1/2)/(q (1/2 - 1/(2 pi))) = sigma_w2 pi/((pi - 1)(sigma_w2 + sigma_b2)), at every grid point."""
    sw, sb = np.array([0.5, 2.0, 3.0]), np.array([0.0, 0.1, 1.0])
    got = sf.chi1("relu", sw, sb, norm="batch", norm_at="after")
    assert np.allclose(got, sw * math.pi / ((math.pi - 1) * (sw + sb)), rtol=1e-14, atol=0)
    r = sf.batchnorm("relu", 2.0, 0.1, norm_at="after", dps=30)
    with mpmath.workdps(30):
        want = 2 * mpmath.pi / ((mpmath.pi - 1) * mpmath.mpf("2.1"))
    assert abs(r.rate - want) < mpmath.mpf(10) ** -28


def test_batchnorm_gamma_of_the_logits_against_networks():
    """gamma = q_ab/(q - q_ab) of the last layer's pre-activations (a readout's logits) under BatchNorm
    before relu, against seeded networks of width 2000 (16 networks, a batch of 8 orthonormal inputs)."""
    r = sf.batchnorm("relu", 2.0, 0.1, 8)
    sim = sf.simulate("relu", 2000, 5, 2.0, 0.1, n_inputs=8, n_networks=16, seed=3, norm="batch")
    q, qab = sim.networks.q[:, -1], sim.networks.qab[:, -1]
    g = qab / (q - qab)
    assert abs(g.mean() - r.gamma) <= 3 * g.std(ddof=1) / 4


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,name", [(dict(norm="group"), "norm"), (dict(norm="layer", norm_at="middle"), "norm_at"),
                                     (dict(norm="batch", batch=1), "batch"), (dict(norm="layer", batch=8), "batch")])
@pytest.mark.parametrize("func", ["q_map", "chi1", "phase", "eoc", "propagate"])
def test_bad_norm_arguments(func, kw, name):
    calls = {"q_map": lambda: sf.q_map("tanh", 1.0, 1.0, 0.1, **kw), "chi1": lambda: sf.chi1("tanh", 1.0, 0.1, **kw),
             "phase": lambda: sf.phase("tanh", 1.0, 0.1, **kw), "eoc": lambda: sf.eoc("tanh", 0.1, **kw),
             "propagate": lambda: sf.propagate("tanh", 1.0, 0.1, depth=3, **kw)}
    with pytest.raises(sf.SymfieldError, match=f"'{name}' parameter of {func}"):
        calls[func]()


def test_batchnorm_unequal_norms_and_unsupported_requests():
    with pytest.raises(NotImplementedError, match="equicorrelated"):
        sf.qab_map("relu", 1.0, 2.0, 0.3, 2.0, 0.0, norm="batch", batch=8)
    with pytest.raises(NotImplementedError, match="equicorrelated"):
        sf.propagate("relu", 2.0, 0.0, depth=3, qbb0=2.0, norm="batch")
    with pytest.raises(NotImplementedError, match="after phi at a finite batch"):
        sf.chi1("relu", 2.0, 0.0, norm="batch", norm_at="after", batch=8)
    with pytest.raises(ValueError, match="no edge of chaos"):
        sf.eoc("relu", 0.1, norm="batch", batch=8)
    with pytest.raises(ValueError, match="'batch' parameter of simulate"):
        sf.simulate("relu", 100, 2, 2.0, 0.0, n_inputs=4, norm="batch", batch=8)


def test_derive_has_a_normalisation_section_on_request():
    doc = sf.derive("relu", norm=True)
    assert "Normalisation layers" not in sf.derive("relu") and "Normalisation layers" in doc
    sec = doc.split(r"\section{Normalisation layers}")[1].split(r"\section")[0]
    assert r"V(1) - \E[\psi](1)^2" not in sec and r"\frac{\pi}{-1 + \pi}" in sec.replace(r"\pi - 1", "-1 + \\pi")
    assert r"- V(1) = 0." in sec           # relu: E[relu'^2] = V(1) = 1/2, the ray is the axis


def test_c_star_and_eoc_curve_under_normalisation():
    # BN before relu: G_od = arc-cosine kernel at unit variance and correlation -1/(B-1) (written here)
    B, sw, sb = 8, 2.0, 0.1
    r = -1 / (B - 1)
    God = (math.sqrt(1 - r * r) + (math.pi - math.acos(r)) * r) / (2 * math.pi)
    assert sf.c_star("relu", sw, sb, norm="batch", batch=B) == pytest.approx((sw * God + sb) / (sw / 2 + sb), rel=1e-13)
    ratio = float(gauss1(lambda z: mpmath.sech(z) ** 4) - gauss1(lambda z: mpmath.tanh(z) ** 2))
    assert sf.eoc_curve("tanh", [0.05, 0.2], norm="layer") == pytest.approx([0.05 / ratio, 0.2 / ratio], rel=1e-10)
    assert np.isnan(sf.eoc_curve("relu", [0.1], norm="batch")).all()
    with pytest.raises(ValueError, match="'dps' parameter of c_star"):
        sf.c_star("relu", 2.0, 0.1, norm="layer", dps=20)


def test_batchnorm_sphere_moments_at_dps():
    """B = 3: x = sqrt(2) (cos theta, cos(theta - 2 pi/3)) with theta uniform (mpmath quadrature written here)."""
    with mpmath.workdps(30):
        a = 2 * mpmath.pi / 3
        God = mpmath.quad(lambda t: mpmath.tanh(mpmath.sqrt(2) * mpmath.cos(t)) *
                          mpmath.tanh(mpmath.sqrt(2) * mpmath.cos(t - a)), [0, mpmath.pi, 2 * mpmath.pi]) / (2 * mpmath.pi)
        r = sf.batchnorm("tanh", 1.0, 0.0, 3, dps=20)
        assert abs(r.q_ab_star - God) < mpmath.mpf(10) ** -19
        assert r.rate == mpmath.inf


def test_q_star_under_normalisation():
    V1 = gauss1(lambda z: mpmath.tanh(z) ** 2, 30)
    assert sf.q_star("tanh", [1.5, 2.0], 0.1, norm="layer") == pytest.approx([float(1.5 * V1 + 0.1),
                                                                              float(2.0 * V1 + 0.1)], rel=1e-12)
    with mpmath.workdps(30):
        assert abs(sf.q_star("tanh", 1.5, 0.1, norm="layer", dps=25) - (mpmath.mpf("1.5") * V1 + mpmath.mpf("0.1"))) \
            < mpmath.mpf(10) ** -24
    assert sf.q_star("gelu", 1.5, 0.1, norm="layer", norm_at="after") == pytest.approx(1.6, rel=1e-15)
    assert sf.q_star("relu", 2.0, 0.1, norm="batch", batch=8) == pytest.approx(1.1, rel=1e-14)   # 2 V(1) + 0.1


def test_neutrality_under_normalisation():
    # BN before relu: c* = 1/2 where sigma_w2 (G_d - 2 G_od) = sigma_b2, G_od the arc-cosine kernel at -1/7
    r = -1 / 7
    God = (math.sqrt(1 - r * r) + (math.pi - math.acos(r)) * r) / (2 * math.pi)
    assert sf.neutrality("relu", 0.1, norm="batch", batch=8) == pytest.approx(0.1 / (0.5 - 2 * God), rel=1e-10)
    # LayerNorm before phi: c* depends on sigma_b2/sigma_w2 only, so the neutrality line is a ray too
    w1, w2 = sf.neutrality("tanh", [0.1, 0.2], norm="layer")
    assert w2 == pytest.approx(2 * w1, rel=1e-8)


@pytest.mark.parametrize("B", [2, 3])
def test_dead_fraction_float64_against_the_orthant_formulas(B):
    """P(h_a <= 0 for all a) of an equicorrelated Gaussian batch: 1/4 + asin(c)/(2 pi) for B = 2 and
    1/8 + 3 asin(c)/(4 pi) for B = 3 (Sheppard's orthant formulas), over the whole range of c, negative included."""
    from symfield.theory.norm import dead_fraction_f64
    lo = -1 / (B - 1)
    c = np.concatenate([lo + np.array([1e-6, 1e-4]), np.linspace(lo, 1, 41)[1:-1], [0.999, 0.999999, 1.0]])
    with mpmath.workdps(30):     # (1e-9 from lo, c's last binary digit moves P by 1e-13: the slope is 1/(2 pi sqrt(1 - c^2)))
        exact = np.array([float(mpmath.mpf(1) / 4 + mpmath.asin(v) / (2 * mpmath.pi)) if B == 2 else
                          float(mpmath.mpf(1) / 8 + 3 * mpmath.asin(v) / (4 * mpmath.pi)) for v in c])
    assert np.max(np.abs(dead_fraction_f64(B, c) - exact)) <= 1e-13


def test_dead_fraction_float64_against_mpmath_at_batch_8():
    from symfield.theory.norm import dead_fraction, dead_fraction_f64
    c = np.array([-1 / 7 + 1e-6, -0.0812, 0.9])
    want = np.array([float(dead_fraction(8, float(v), dps=30)) for v in c])
    assert np.max(np.abs(dead_fraction_f64(8, c) - want)) <= 1e-13
