"""sf.trainability against closed forms in mpmath (erf: q*, c*, chi1, chi_c* from its arcsine kernel), and the
edge-of-chaos limits of Theta_ab/Theta_aa (1/4 for relu, 1/3 for smooth phi) against the NTK recursion written here."""
import math

import mpmath as mp
import pytest

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


def _relu_ratio(depth):
    """Theta_ab/Theta_aa of relu at (2, 0), q0 = 1, qab0 = 0 (closed forms in mpmath at 40 digits: 1 - c ~ 1/l^2)."""
    with mp.workdps(40):
        q, c, ta, tb = mp.mpf(2), mp.mpf(0), mp.mpf(2), mp.mpf(0)
        for _ in range(depth - 1):
            th = mp.acos(c / q)
            T_ab = q / (2 * mp.pi) * (mp.sin(th) + (mp.pi - th) * mp.cos(th))
            c = 2 * T_ab
            ta, tb = q + ta, c + 2 * (mp.pi - th) / (2 * mp.pi) * tb
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
