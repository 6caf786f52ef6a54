"""gamma^(l) divergence classifier (docs/theory.md section 7) against the known asymptotics."""
import math

import mpmath
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
