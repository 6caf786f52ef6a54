"""sf.trainability against closed forms in mpmath (erf: q*, c*, chi1, chi_c* from its arcsine kernel), and the
edge-of-chaos limits of Theta_ab/Theta_aa (1/4 for relu, 1/3 for smooth phi) against the NTK recursion written here,
and q* = 0 or inf: relu and relu+max2 (E[psi'^2], V(1) by mpmath quadrature over the law of the max of two normals)
through the normalised NTK Theta/q, gelu (not derived: NaN with a note), tanh at q* = 0."""
import math

import mpmath as mp
import pytest

from symfield.symbolic.activation import activation
from symfield.theory.ntk import ntk
from symfield.theory.trainability import trainability


def _erf_fixed_point(sw, sb):
    """q*, c*, chi1, chi_c* of erf from V = (2/pi) asin(2q/(1+2q)), C likewise, Tdot = (4/pi)/sqrt((1+2q)^2-4 q12^2)."""
    sw, sb = mp.mpf(sw), mp.mpf(sb)
    q = mp.findroot(lambda q: sw * 2 / mp.pi * mp.asin(2 * q / (1 + 2 * q)) + sb - q, 0.5)
    c = mp.mpf(0)
    for _ in range(20000):
        c = (sw * 2 / mp.pi * mp.asin(2 * c * q / (1 + 2 * q)) + sb) / q
    tdot = lambda q12: 4 / mp.pi / mp.sqrt((1 + 2 * q) ** 2 - 4 * q12 ** 2)   # noqa: E731
    return q, c, sw * tdot(q), sw * tdot(c * q)


def test_ordered_erf():
    with mp.workdps(30):
        q, c, chi1, _ = _erf_fixed_point(1.25, 0.05)
        t = trainability("erf", 1.25, 0.05)
        assert t.regime == "ordered" and t.c_star == 1.0
        assert t.chi1 == pytest.approx(float(chi1), rel=1e-12)
        assert t.theta_star == pytest.approx(float(q / (1 - chi1)), rel=1e-11)
        assert t.xi_1 == pytest.approx(float(-1 / mp.log(chi1)), rel=1e-10)


def test_chaotic_erf():
    with mp.workdps(30):
        q, c, chi1, chi_c = _erf_fixed_point(1.5, 0.05)
        t = trainability("erf", 1.5, 0.05)
        assert t.regime == "chaotic" and t.theta_star == math.inf
        assert t.c_star == pytest.approx(float(c), rel=1e-10)
        assert t.chi_c_star == pytest.approx(float(chi_c), rel=1e-10)
        assert t.theta_ab_star == pytest.approx(float(c * q / (1 - chi_c)), rel=1e-9)
        assert t.xi_star == pytest.approx(float(-1 / (mp.log(chi_c) - mp.log(chi1))), rel=1e-9)
    r = ntk("erf", 1.5, 0.05, 1500, layers=[1500])          # Theta_ab reaches its fixed point (~ l chi_c*^l)
    assert float(r.theta_ab[-1]) == pytest.approx(t.theta_ab_star, rel=1e-9)


def _relu_ratio(depth, sw=2):
    """Theta_ab/Theta_aa of relu at (sw, 0), q0 = 1, qab0 = 0 (closed forms in mpmath at 40 digits: 1 - c ~ 1/l^2)."""
    with mp.workdps(40):
        sw = mp.mpf(sw)
        q, c, ta, tb = sw, mp.mpf(0), sw, mp.mpf(0)
        for _ in range(depth - 1):
            th = mp.acos(c / q)
            T_ab = q / (2 * mp.pi) * (mp.sin(th) + (mp.pi - th) * mp.cos(th))
            q, c = sw * q / 2, sw * T_ab
            ta, tb = q + sw / 2 * ta, c + sw * (mp.pi - th) / (2 * mp.pi) * tb
        return float(tb / ta)


def test_edge_of_chaos_ratio_relu():
    t = trainability("relu", 2.0, 0.0)
    assert t.regime == "edge-of-chaos" and t.eoc_ratio_limit == 0.25
    errs = []
    for L in (100, 1000, 10000):
        r = ntk("relu", 2.0, 0.0, L, layers=[L])
        ratio = float(r.theta_ab[-1] / r.theta_aa[-1])
        assert ratio == pytest.approx(_relu_ratio(L), rel=1e-10)
        errs.append(abs(ratio - 0.25))
    assert errs[0] > 10 * errs[1] * 0.5 and errs[1] > 5 * errs[2] and errs[2] < 1e-3, errs


def test_edge_of_chaos_ratio_erf():
    sw = 1.7476037497677032           # the erf edge of chaos at sigma_b2 = 0.18
    t = trainability("erf", sw, 0.18)
    assert t.regime == "edge-of-chaos" and t.eoc_ratio_limit == pytest.approx(1 / 3)
    errs = []
    for L in (100, 1000, 10000):
        r = ntk("erf", sw, 0.18, L, layers=[L])
        errs.append(abs(float(r.theta_ab[-1] / r.theta_aa[-1]) - 1 / 3))
    assert errs[0] > 3 * errs[1] and errs[1] > 3 * errs[2] and errs[2] < 1e-3, errs


def test_phase_diagram_ntk_fields_against_mpmath():
    import numpy as np

    import symfield as sf
    pd = sf.phase_diagram("erf", [1.25, 1.5], [0.05], depth=30, ntk=True, m=10)
    with mp.workdps(30):
        q, _, chi1, _ = _erf_fixed_point(1.25, 0.05)
        assert pd.depth_scale[0, 0] == pytest.approx(float(-1 / mp.log(chi1)), rel=1e-10)
        q, c, chi1, chi_c = _erf_fixed_point(1.5, 0.05)
        assert pd.depth_scale[1, 0] == pytest.approx(float(-1 / (mp.log(chi_c) - mp.log(chi1))), rel=1e-9)
        assert pd.chi_c_star[1, 0] == pytest.approx(float(chi_c), rel=1e-10)
    with mp.workdps(40):     # kappa = 1 + m gamma_Theta at layer 30 from the plain recursion (erf closed forms)
        for i, w in enumerate((1.25, 1.5)):
            sw, sb = mp.mpf(w), mp.mpf(0.05)
            qq, cc = sw + sb, sb
            ta, tb = qq, cc
            for _ in range(29):
                A = 1 + 2 * qq
                Td_aa, Td_ab = 4 / mp.pi / mp.sqrt(A * A - 4 * qq * qq), 4 / mp.pi / mp.sqrt(A * A - 4 * cc * cc)
                qq, cc = sw * 2 / mp.pi * mp.asin(2 * qq / A) + sb, sw * 2 / mp.pi * mp.asin(2 * cc / A) + sb
                ta, tb = qq + sw * Td_aa * ta, cc + sw * Td_ab * tb
            assert pd.kappa[i, 0] == pytest.approx(float(1 + 10 * tb / (ta - tb)), rel=1e-11)
    assert np.isfinite(pd.to_xarray()["depth_scale"]).all()


# ------------------------------------------------------------------------------------------- q* = 0 or inf
def _max2_moments():
    """E[relu(M)^2] and P(M > 0) for M the max of two standard normals (density 2 n(m) N(m)), by quadrature."""
    with mp.workdps(30):
        return tuple(2 * mp.quad(lambda m, p=p: m ** p * mp.npdf(m) * mp.ncdf(m), [0, mp.inf]) for p in (2, 0))


@pytest.mark.parametrize("sw,sb", [(1.5, 0.0), (2.5, 0.0), (2.5, 0.1)])
def test_relu_q_star_zero_or_inf_is_the_edge_of_theta_over_q(sw, sb):
    """relu with q* = 0 (sigma_b2 = 0, sigma_w2 < 2) or inf: chi1 = sigma_w2/2 = sigma_w2 V(1), so Theta/q has slope
    rho = 1 at every sigma_w2 and Theta_ab/Theta_aa tends to the edge's 1/4 (sigma_b2 = 0: the very same sequence)."""
    t = trainability("relu", sw, sb)
    assert t.q_star == (0.0 if sw < 2 else math.inf)
    assert t.chi1 == pytest.approx(sw / 2, rel=1e-12) and t.q_growth == pytest.approx(sw / 2, rel=1e-12)
    assert t.regime == "edge-of-chaos" and t.eoc_ratio_limit == 0.25 and t.depth_scale == math.inf
    assert t.theta_star == t.theta_ab_star == (0.0 if sw < 2 else math.inf)
    assert "homogeneous" in t.note
    r = ntk("relu", sw, sb, 1000, layers=[100, 1000])
    ratio = r.theta_ab / r.theta_aa
    if sb == 0:
        assert ratio[-1] == pytest.approx(_relu_ratio(1000, sw), rel=1e-10)
        assert _relu_ratio(100, sw) == pytest.approx(_relu_ratio(100, 2), rel=1e-12)
    assert abs(ratio[-1] - 0.25) < 0.004 and abs(ratio[-1] - 0.25) < abs(ratio[0] - 0.25) / 5, ratio


@pytest.mark.parametrize("sw,sb", [(1.0, 0.0), (2.0, 0.0), (4 / 3, 0.1)])
def test_relu_max2_q_star_zero_or_inf(sw, sb):
    """relu+max2 (positively homogeneous, q* = 0 or inf here): chi1 = sigma_w2 E[psi'^2] = (3/4) sigma_w2 and
    Theta/q has slope rho = E[psi'^2]/V(1) < 1 at every sigma_w2: ordered, xi_1 = -1/log rho, and at sigma_b2 = 0
    Theta_aa/q_l = (1 - rho^l)/(1 - rho) exactly (Theta_aa' = q' + chi1 Theta_aa, q' = sigma_w2 V(1) q)."""
    V1, p = _max2_moments()
    assert abs(p - mp.mpf(3) / 4) < 1e-25                    # P(max of two normals > 0) = 1 - 1/4
    rho = float(p / V1)
    t = trainability(activation("relu", pool="max", k=2), sw, sb)
    assert t.chi1 == pytest.approx(float(sw * p), rel=1e-12)
    assert t.q_growth == pytest.approx(float(sw * V1), rel=1e-12)
    assert t.regime == "ordered" and t.c_star == 1.0 and t.eoc_ratio_limit is None
    assert t.xi_1 == pytest.approx(-1 / math.log(rho), rel=1e-10) and t.depth_scale == t.xi_1
    assert t.theta_star == (0.0 if sb == 0 and sw < 1 / float(V1) else math.inf)
    if sw == 2.0:             # sf.ntk's max-pool maps cost ~0.2 s a layer near c = 1: one sigma_w2 per case
        return
    layers = [5, 20, 30] if sb == 0 else [60]
    r = ntk(activation("relu", pool="max", k=2), sw, sb, layers[-1], layers=layers)
    norm = r.theta_aa / r.q
    if sb == 0:
        for L, v in zip(layers, norm):
            assert v == pytest.approx((1 - rho ** L) / (1 - rho), rel=1e-12), L
    else:                     # rho^60 ~ 1e-5, and the bias's share sigma_b2/q_l ~ 1e-6
        assert norm[-1] == pytest.approx(1 / (1 - rho), rel=1e-4)


def test_q_star_inf_not_homogeneous_is_nan_with_a_note():
    t = trainability("gelu", 3.0, 0.1)
    assert t.q_star == math.inf and math.isnan(t.depth_scale) and math.isnan(t.xi_star)
    assert "not derived" in t.note


def test_q_star_zero_theta_falls_to_zero():
    t = trainability("tanh", 0.5, 0.0)
    assert t.q_star == 0.0 and t.theta_star == 0.0 and t.theta_ab_star == 0.0
    assert t.chi1 == pytest.approx(0.5, rel=1e-6)              # sigma_w2 phi'(0)^2, read at q = 1e-8
    r = ntk("tanh", 0.5, 0.0, 60, layers=[60])
    assert 0 < r.theta_aa[-1] < 1e-14


def test_phase_diagram_depth_scale_at_q_star_zero_or_inf():
    import symfield as sf
    V1, p = _max2_moments()
    pd = sf.phase_diagram(activation("relu", pool="max", k=2), [1.0, 2.0], [0.0, 0.1], ntk=True)
    assert pd.depth_scale[1] == pytest.approx([-1 / math.log(float(p / V1))] * 2, rel=1e-10)
    pd = sf.phase_diagram("relu", [1.5, 2.5], [0.0], ntk=True)
    assert (pd.depth_scale == math.inf).all()
