"""gamma^(l) divergence classifier (docs/theory.md section 7) against the known asymptotics."""
import math

import mpmath
import numpy as np
import pytest

import symfield as sf


def test_relu_ordered_exponential_rate():
    d = sf.divergence("relu", 1.5, 0.1, depth=200)
    assert d.kind == "exponential" and d.rate == pytest.approx(math.log(2 / 1.5), abs=1e-6)
    assert d.gamma[-1] > 1e20 and d.precision.startswith("mpmath")   # far past float64 cancellation


@pytest.mark.parametrize("sw,sb", [(2.5, 0.1), (2.0, 0.0)])
def test_relu_power_law_exponent_two(sw, sb):
    d = sf.divergence("relu", sw, sb, depth=200)
    assert d.kind == "power-law" and d.exponent == pytest.approx(2, abs=0.05)
    d = sf.divergence("relu", sw, sb, depth=1000)
    assert d.exponent == pytest.approx(2, abs=0.01)
    # gamma_l ~ 2 l^2/(9 pi^2) (docs/theory.md section 7)
    assert d.gamma[-1] / (2 * 1000**2 / (9 * math.pi**2)) == pytest.approx(1, abs=0.05)


def test_finite_gamma_matches_c_star():
    d = sf.divergence("erf", 2.0, 0.1, depth=200)
    p = sf.phase("erf", 2.0, 0.1, full=True)
    assert d.kind == "finite" and d.gamma_star == pytest.approx(p.gamma_star, rel=1e-6)


def test_tanh_finite_in_neutral_phase():
    d = sf.divergence("tanh", 3.0, 0.1, depth=80)
    assert d.kind == "finite" and d.gamma_star == pytest.approx(sf.phase("tanh", 3.0, 0.1, full=True).gamma_star, rel=1e-6)


@pytest.mark.slow
def test_tanh_power_law_at_its_eoc():
    e = sf.eoc("tanh", 0.1)
    d = sf.divergence("tanh", e.sigma_w2, 0.1, depth=200)
    assert d.kind == "power-law" and d.exponent > 0.5


def test_divergence_bad_input():
    with pytest.raises(ValueError, match="'depth' parameter of divergence must be an integer >= 20"):
        sf.divergence("relu", 1.5, 0.1, depth=5)
    with pytest.raises(ValueError, match="'sigma_w2' parameter of divergence"):
        sf.divergence("relu", float("nan"), 0.1)


def test_deep_ordered_relu_keeps_its_digits():
    """depth 400: gamma ~ (4/3)^400 ~ 1e50, far beyond where q - q12 cancels at 40 digits. gamma = 2 q12/d
    with d on its own map keeps all 40 digits (checked against an independent 400-digit recursion of the
    plain q, q12 maps written here) and shows the exponential law with rate ln(2/1.5), not a false 'finite'."""
    d = sf.divergence("relu", 1.5, 0.1, depth=400)
    assert d.kind == "exponential" and abs(d.rate - math.log(2 / 1.5)) < 1e-6
    assert d.precision == "mpmath(40)" and d.gamma[-1] > 1e45
    with mpmath.workdps(400):
        sw, sb = mpmath.mpf("1.5"), mpmath.mpf("0.1")
        q, q12 = sw + sb, sb
        for _ in range(399):
            th = mpmath.acos(q12 / q)
            q, q12 = sw * q / 2 + sb, sw * q * (mpmath.sin(th) + (mpmath.pi - th) * q12 / q) / (2 * mpmath.pi) + sb
        ref = q12 / (q - q12)
    assert abs(d.gamma[-1] - float(ref)) <= 1e-14 * float(ref)


# ---------------------------------------------------------------- under normalisation (docs/theory.md section 12)
def test_batchnorm_before_reaches_its_gram_after_one_layer():
    """BN(h) is uniform on the sphere of radius sqrt(B) whatever (q, c): gamma is constant from layer 2 on."""
    d = sf.divergence("relu", 2.0, 0.1, depth=40, norm="batch", batch=8)
    assert d.kind == "finite" and d.precision == "mpmath(40)"
    # oracle: relu is homogeneous, so G_d = V(1) = 1/2 and G_od = C(1, 1, -1/7) (arc-cosine kernel, closed form)
    with mpmath.workdps(30):
        r = mpmath.mpf(-1) / 7
        g_od = (mpmath.sqrt(1 - r**2) + (mpmath.pi - mpmath.acos(r)) * r) / (2 * mpmath.pi)
        sw, sb = mpmath.mpf(2), mpmath.mpf("0.1")
        gamma = (sw * g_od + sb) / (sw * (mpmath.mpf(1) / 2 - g_od))
    assert d.gamma_star == pytest.approx(float(gamma), rel=1e-14)
    assert d.gamma_star == pytest.approx(sf.batchnorm("relu", 2.0, 0.1, 8).gamma, rel=1e-14)
    assert d.gamma[1:] == pytest.approx(d.gamma_star, rel=1e-14)


def test_layernorm_after_relu_at_zero_bias_gives_gamma_star_zero():
    """c_hat(0) = 0 for relu (E[relu(u) relu(v)] = m^2 at c = 0): the inputs' c = 0 is a fixed point; gamma is
    0 to the 40 digits of the recursion and is reported as exactly 0, not as the rounding noise."""
    d = sf.divergence("relu", 2.0, 0.0, depth=40, norm="layer", norm_at="after")
    assert d.kind == "finite" and d.gamma_star == 0.0 and max(abs(d.gamma)) < 1e-38


def test_the_classifier_reports_a_geometric_decay_to_zero_as_zero():
    from symfield.theory.divergence import _geometric_limit
    layers = np.arange(1, 201)
    decay = 0.5 * (math.pi / (2 * (math.pi - 1))) ** layers      # the slope of LN-after relu at c = 0
    assert _geometric_limit(decay, np.finfo(float).eps) == 0.0
    assert _geometric_limit(0.2 + decay, np.finfo(float).eps) == pytest.approx(0.2, rel=1e-13)
    assert _geometric_limit(0.2 * layers ** 2.0, np.finfo(float).eps) is None


def test_layernorm_before_tanh_is_chaotic_and_gamma_converges_to_ln_c_star():
    """chi1 = E[sech^4]/E[tanh^2] = 1.1778 > 1 at sigma_b2 = 0: c* < 1. At sigma_b2 = 0 the inputs' c = 0 stays
    0 (odd phi); at sigma_b2 = 0.01 gamma converges to c*/(1 - c*), c* the fixed point of c -> (sw C(1, 1, c)
    + sb)/(sw V(1) + sb) computed here by Gauss-Hermite quadrature of the Gaussian integrals."""
    d0 = sf.divergence("tanh", 1.0, 0.0, depth=60, norm="layer")
    assert d0.kind == "finite" and d0.gamma_star == 0.0
    d = sf.divergence("tanh", 1.0, 0.01, depth=200, norm="layer")
    x, w = np.polynomial.hermite_e.hermegauss(160)         # Gauss-Hermite for N(0, 1): smooth tanh, ~1e-15
    w = w / w.sum()
    V1 = w @ np.tanh(x) ** 2

    def cmap(c):
        s = math.sqrt(1 - c * c)
        C = w @ (np.tanh(x)[:, None] * np.tanh(c * x[:, None] + s * x[None, :])) @ w
        return (C + 0.01) / (V1 + 0.01) - c
    from scipy.optimize import brentq
    c_star = brentq(cmap, 0.1, 0.5, xtol=1e-15, rtol=1e-15)
    assert d.kind == "finite" and d.precision == "float64"
    assert d.gamma_star == pytest.approx(c_star / (1 - c_star), rel=1e-9)
    from symfield.symbolic.kernel import kernel
    from symfield.theory import norm as nm
    c = nm.ln_c_star(kernel("tanh"), nm.options("t", "layer"), 1.0, 0.01)
    assert d.gamma_star == pytest.approx(c / (1 - c), rel=1e-9)


def test_layernorm_before_relu_diverges_as_the_plain_relu_power_law():
    """E[relu'^2](1) = V(1) = 1/2: chi1 = 1 at sigma_b2 = 0, and the normalised c-map is the plain one (relu is
    homogeneous), so the power law gamma_l ~ 2 l^2/(9 pi^2) of docs/theory.md section 7 is kept."""
    d = sf.divergence("relu", 2.0, 0.0, depth=300, norm="layer")
    plain = sf.divergence("relu", 2.0, 0.0, depth=300)
    assert d.kind == plain.kind == "power-law"
    assert d.exponent == pytest.approx(plain.exponent, rel=1e-12) and d.exponent == pytest.approx(2, abs=0.03)
    assert d.gamma[1:] == pytest.approx(plain.gamma[1:], rel=1e-13)
    assert d.gamma[-1] / (2 * 300**2 / (9 * math.pi**2)) == pytest.approx(1, abs=0.1)     # 1 + O(1/l)


@pytest.mark.parametrize("kw,name", [(dict(norm="group"), "norm"), (dict(norm="layer", norm_at="middle"), "norm_at"),
                                     (dict(norm="batch", batch=1), "batch"), (dict(norm="layer", batch=8), "batch")])
def test_divergence_bad_norm_arguments(kw, name):
    with pytest.raises(sf.SymfieldError, match=f"'{name}' parameter of divergence"):
        sf.divergence("relu", 2.0, 0.0, depth=20, **kw)
