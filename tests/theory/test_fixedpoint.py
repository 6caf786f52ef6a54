"""Variance fixed point q* by bracketing root finding."""
import math

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from oracles import mp_expect1
from symfield.numeric.maps import maps
from symfield.symbolic.kernel import kernel


def test_relu_q_star_closed_form():
    for sw, sb in [(0.5, 0.1), (1.5, 0.1), (1.9, 2.0)]:
        assert sf.q_star("relu", sw, sb) == pytest.approx(sb / (1 - sw / 2), rel=1e-14)
    assert sf.q_star("relu", 2.5, 0.1) == math.inf          # variance grows geometrically
    assert sf.q_star("relu", 1.5, 0.0) == 0.0


def test_relu_chi1_at_q_star():
    assert sf.chi1("relu", 1.5, 0.1) == pytest.approx(0.75, rel=1e-15)


def test_tanh_public_reference_q_star():
    # docs/theory.md section 5: tanh EOC at sigma_b2 = 0.05 is sigma_w2 = 1.76095 with q* = 0.57005
    assert sf.q_star("tanh", 1.76095, 0.05) == pytest.approx(0.57005, abs=5e-6)
    assert sf.q_star("tanh", 0.9, 0.0) == 0.0
    assert sf.q_star("tanh", 2.0, 0.0) > 0.5


def test_q_star_dps_solves_the_defining_equation():
    r = sf.q_star("tanh", 1.5, 0.1, dps=30)
    with mp.workdps(30):
        resid = mp.mpf("1.5") * mp_expect1(lambda t: mp.tanh(t) ** 2, r, dps=30) + mp.mpf("0.1") - r
        assert abs(resid) < mp.mpf(10) ** -27
    assert abs(float(r) - sf.q_star("tanh", 1.5, 0.1)) < 1e-13


def test_q_star_broadcasts():
    out = sf.q_star("erf", np.array([[0.5], [1.5]]), np.array([0.0, 0.1]))
    assert out.shape == (2, 2) and out[0, 0] == 0.0 and out[1, 1] > 0


def test_eoc_public_reference_values():
    # docs/theory.md section 5
    e = sf.eoc("tanh", 0.05)
    assert e.sigma_w2 == pytest.approx(1.76095, abs=5e-6) and e.q_star == pytest.approx(0.57005, abs=5e-6)
    assert sf.eoc("tanh", 0.1).sigma_w2 == pytest.approx(1.98607, abs=5e-6)
    assert sf.eoc("tanh", 0.0).sigma_w2 == 1.0                     # exactly 1/phi'(0)^2
    assert sf.eoc("erf", 0.0).sigma_w2 == pytest.approx(math.pi / 4, rel=1e-15)
    assert sf.eoc("relu", 0.0).sigma_w2 == 2.0


def test_eoc_erf_closed_form_relation():
    for sb in (0.01, 0.1, 1.0):
        e = sf.eoc("erf", sb)
        assert e.sigma_w2 == pytest.approx(math.pi / 4 * math.sqrt(1 + 4 * e.q_star), rel=1e-13)


def test_eoc_relu_is_the_vertical_line_two():
    """Positively homogeneous: chi1 = sigma_w2/2 at every q, so the EOC is sigma_w2 = 2 at every
    sigma_b2, with q* = inf for sigma_b2 > 0 (tests/theory/test_eoc_homogeneous.py covers the family)."""
    e = sf.eoc("relu", 0.1)
    assert (e.sigma_w2, e.q_star) == (2.0, math.inf) and "vertical line" in e.note


def test_eoc_dps30_solves_both_equations_independently():
    e = sf.eoc("tanh", 0.05, dps=30)
    with mp.workdps(30):
        qs, sw = e.q_star, e.sigma_w2
        V = mp_expect1(lambda t: mp.tanh(t) ** 2, qs, dps=30)
        d = mp_expect1(lambda t: 1 / mp.cosh(t) ** 4, qs, dps=30)
        assert abs(sw * V + mp.mpf("0.05") - qs) < mp.mpf(10) ** -27
        assert abs(sw * d - 1) < mp.mpf(10) ** -27


@pytest.mark.slow
def test_eoc_dps50_digits_agree_with_dps70():
    a, b = sf.eoc("tanh", 0.05, dps=50), sf.eoc("tanh", 0.05, dps=70)
    with mp.workdps(70):
        assert abs(a.sigma_w2 - b.sigma_w2) < mp.mpf(10) ** -49


def test_eoc_curve_vectorised():
    sb = np.array([0.0, 0.05, 0.1])
    out = sf.eoc_curve("tanh", sb)
    assert out[0] == 1.0 and out[1] == pytest.approx(1.76095, abs=5e-6) and out[2] == pytest.approx(1.98607, abs=5e-6)


def _erf_cmap(sw, sb, qs, c):
    from oracles import REGISTRY
    C = REGISTRY["erf"]["C"]
    return (sw * C(qs, qs, c * qs) + sb) / qs


def test_relu_c_star_is_one_everywhere():
    for sw, sb in [(0.5, 0.1), (1.5, 0.1), (2.5, 0.1), (1.0, 0.0), (3.0, 0.0)]:
        assert sf.c_star("relu", sw, sb) == 1.0


@pytest.mark.parametrize("sw,sb", [(3.0, 0.1), (5.0, 0.1), (2.0, 0.05)])
def test_erf_c_star_is_a_stable_fixed_point_of_the_literature_map(sw, sb):
    cs = sf.c_star("erf", sw, sb)
    qs = sf.q_star("erf", sw, sb)
    with mp.workdps(30):
        swm, sbm = mp.mpf(repr(sw)), mp.mpf(repr(sb))
        from oracles import REGISTRY
        assert abs(swm * REGISTRY["erf"]["V"](mp.mpf(qs)) + sbm - qs) < 1e-13
        assert abs(_erf_cmap(swm, sbm, mp.mpf(qs), mp.mpf(cs)) - cs) < 1e-12
        slope = mp.diff(lambda c: _erf_cmap(swm, sbm, mp.mpf(qs), c), mp.mpf(cs))
        assert 0 <= slope < 1
    assert cs < 1


def test_erf_ordered_phase_has_c_star_one():
    assert sf.c_star("erf", 1.2, 0.1) == 1.0


def test_tanh_without_bias_keeps_inputs_uncorrelated():
    assert sf.c_star("tanh", 0.5, 0.0) == 0.0 and sf.c_star("tanh", 2.0, 0.0) == 0.0


def test_neutrality_erf_root_is_c_star_one_half():
    sw = sf.neutrality("erf", 0.1)
    qs = sf.q_star("erf", sw, 0.1)
    with mp.workdps(30):
        assert abs(_erf_cmap(mp.mpf(sw), mp.mpf("0.1"), mp.mpf(qs), mp.mpf("0.5")) - mp.mpf("0.5")) < 1e-11
    assert sf.c_star("erf", sw * 0.99, 0.1) > 0.5 > sf.c_star("erf", sw * 1.01, 0.1)


def _erf_neutral_sw(sb):
    """erf's neutrality line from the arcsine kernel (30 digits): V(q) = (2/pi) asin(2q/(1+2q)),
    C(q, q, q/2) = (2/pi) asin(q/(1+2q)); on sigma_w2 = (q - sigma_b2)/V(q) solve sigma_w2 C + sigma_b2 = q/2."""
    with mp.workdps(30):
        sb = mp.mpf(sb)
        V = lambda q: 2 / mp.pi * mp.asin(2 * q / (1 + 2 * q))  # noqa: E731
        C = lambda q: 2 / mp.pi * mp.asin(q / (1 + 2 * q))  # noqa: E731
        q = mp.findroot(lambda q: (q - sb) / V(q) * C(q) + sb - q / 2, (sb * 1.001, 50 * sb + 10), solver="anderson")
        return float((q - sb) / V(q))


def test_phase_diagram_neutrality_line_up_to_the_largest_sigma_w2_drawn():
    """The line where the diagram draws it: the closed-form root where sigma_w2 <= 3 (sb = 0.01, 0.05), NaN
    beyond (sb = 0.2: 3.03; 0.5: 4.71) and at sigma_b2 = 0; sf.neutrality still finds the roots beyond."""
    sb = np.array([0.0, 0.01, 0.05, 0.2, 0.5])
    pd = sf.phase_diagram("erf", np.linspace(0, 3, 7), sb)
    ref = np.array([_erf_neutral_sw(b) for b in sb[1:]])
    assert np.isnan(pd.neutrality[[0, 3, 4]]).all() and (ref[2:] > 3).all() and (ref[:2] < 3).all()
    np.testing.assert_allclose(pd.neutrality[1:3], ref[:2], rtol=1e-9)
    np.testing.assert_allclose(sf.neutrality("erf", sb[1:]), ref, rtol=1e-9)


def test_neutrality_errors():
    with pytest.raises(ValueError, match="'sigma_b2' parameter of neutrality"):
        sf.neutrality("erf", -0.1)
    with pytest.raises(ValueError, match="no neutrality line"):
        sf.neutrality("relu", 0.1)


@pytest.mark.slow
def test_neutrality_tanh_avg2_is_twice_tanh():
    a = sf.neutrality("tanh", 0.1)
    b = sf.neutrality(sf.activation("tanh", pool="avg", k=2), 0.1)
    assert b == pytest.approx(2 * a, rel=1e-9)


@pytest.mark.parametrize("act,sw,sb,label", [
    ("relu", 1.5, 0.1, "ordered-deep-prejudice"), ("relu", 2.5, 0.1, "chaotic-deep-prejudice"),
    ("relu", 2.0, 0.0, "edge-of-chaos"), ("erf", 1.2, 0.1, "ordered-deep-prejudice"),
    ("erf", 2.0, 0.1, "prejudice"), ("erf", 3.0, 0.1, "neutrality")])
def test_phase_labels(act, sw, sb, label):
    assert sf.phase(act, sw, sb) == label


def test_phase_fields_and_eoc_tolerance():
    e = sf.eoc("tanh", 0.05)
    p = sf.phase("tanh", e.sigma_w2, 0.05, full=True)
    assert p.label == "edge-of-chaos" and p.c_star == 1.0 and p.gamma_star == math.inf
    assert abs(p.slope - 1) < 1e-9
    assert sf.phase("tanh", e.sigma_w2 * (1 - 1e-3), 0.05) == "ordered-deep-prejudice"
    p = sf.phase("erf", 2.0, 0.1, full=True)
    assert p.gamma_star == pytest.approx(p.c_star / (1 - p.c_star)) and 1 < p.gamma_star < math.inf
    with pytest.raises(ValueError, match="'eoc_tol' parameter of phase"):
        sf.phase("erf", 2.0, 0.1, eoc_tol=-1)


@pytest.mark.parametrize("k", [2, 3])
def test_tanh_avg_pool_eoc_is_k_times_tanh(k):
    act = sf.activation("tanh", pool="avg", k=k)
    for sb in (0.0, 0.05):
        assert sf.eoc(act, sb).sigma_w2 == pytest.approx(k * sf.eoc("tanh", sb).sigma_w2, rel=1e-13)


def test_tanh_max2_eoc_equals_tanh():
    act = sf.activation("tanh", pool="max", k=2)
    for sb in (0.0, 0.1):
        assert sf.eoc(act, sb).sigma_w2 == pytest.approx(sf.eoc("tanh", sb).sigma_w2, rel=1e-13)


def test_depth_scales_relu_ordered():
    # q* = sigma_b2/(1 - sigma_w2/2); V' = 1/2 and E[step(u) step(v)] at c* = 1 is 1/2
    assert sf.xi_q("relu", 1.5, 0.1) == pytest.approx(-1 / math.log(0.75), rel=1e-14)
    assert sf.xi_c("relu", 1.5, 0.1) == pytest.approx(-1 / math.log(0.75), rel=1e-14)


def test_depth_scales_erf_against_literature_derivatives():
    from oracles import REGISTRY
    sw, sb = 3.0, 0.1
    qs, cs = sf.q_star("erf", sw, sb), sf.c_star("erf", sw, sb)
    with mp.workdps(30):
        dV = mp.diff(REGISTRY["erf"]["V"], mp.mpf(qs))
        dC = REGISTRY["erf"]["dC"](mp.mpf(qs), mp.mpf(qs), mp.mpf(cs) * qs)
    assert sf.xi_q("erf", sw, sb) == pytest.approx(float(-1 / mp.log(sw * dV)), rel=1e-10)
    assert sf.xi_c("erf", sw, sb) == pytest.approx(float(-1 / mp.log(sw * dC)), rel=1e-10)


def test_xi_c_diverges_at_the_edge_of_chaos():
    e = sf.eoc("erf", 0.1)
    far, near = sf.xi_c("erf", e.sigma_w2 * 0.99, 0.1), sf.xi_c("erf", e.sigma_w2 * 0.999, 0.1)
    assert near > 9 * far > 0


# ---------------------------------------------------------------- c*, neutrality at any precision
def _erf_stable_fixed_point(sw, sb, cs, tol):
    from oracles import REGISTRY
    with mp.workdps(40):
        swm, sbm = mp.mpf(repr(sw)), mp.mpf(repr(sb))
        qs = mp.findroot(lambda q: swm * REGISTRY["erf"]["V"](q) + sbm - q, mp.mpf(sf.q_star("erf", sw, sb)))
        assert abs(_erf_cmap(swm, sbm, qs, mp.mpf(cs)) - cs) < tol
        assert 0 <= mp.diff(lambda c: _erf_cmap(swm, sbm, qs, c), mp.mpf(cs)) < 1


def test_c_star_just_above_the_edge_of_chaos_is_below_one():
    # chaotic side of the EOC: c = 1 is unstable and the stable c* sits close to (but below) 1
    sw = sf.eoc("erf", 0.1).sigma_w2 * 1.01
    cs = sf.c_star("erf", sw, 0.1)
    assert 0.9 < cs < 1
    _erf_stable_fixed_point(sw, 0.1, cs, 1e-13)
    assert sf.c_star("tanh", 2.0, 0.1) < 1 and sf.phase("tanh", 2.0, 0.1) == "prejudice"


def test_c_star_dps30_against_the_literature_map():
    cs = sf.c_star("erf", 3.0, 0.1, dps=30)
    assert isinstance(cs, mp.mpf)
    _erf_stable_fixed_point(3.0, 0.1, cs, mp.mpf(10) ** -28)
    assert abs(float(cs) - sf.c_star("erf", 3.0, 0.1)) < 1e-13
    assert sf.c_star("erf", 1.2, 0.1, dps=30) == 1


def test_neutrality_dps30_against_the_literature_map():
    from oracles import REGISTRY
    sw = sf.neutrality("erf", 0.1, dps=30)
    with mp.workdps(40):
        sb = mp.mpf("0.1")
        qs = mp.findroot(lambda q: sw * REGISTRY["erf"]["V"](q) + sb - q, mp.mpf(1))
        assert abs(_erf_cmap(sw, sb, qs, mp.mpf(1) / 2) - mp.mpf(1) / 2) < mp.mpf(10) ** -28
    assert abs(float(sw) - sf.neutrality("erf", 0.1)) < 1e-12


def test_neutrality_vectorised_and_k_times_for_avg_pools():
    sb = np.array([0.05, 0.1, 0.2])
    a = sf.neutrality("erf", sb)
    assert a.shape == (3,) and np.all(np.diff(a) > 0)
    b = sf.neutrality(sf.activation("erf", pool="avg", k=3), sb)
    np.testing.assert_allclose(b, 3 * a, rtol=1e-12)


@pytest.mark.slow
def test_neutrality_tanh_float64_to_1e10_and_dps30_to_25_digits():
    a = sf.neutrality("tanh", 0.1)
    b = sf.neutrality("tanh", 0.1, dps=30)
    c = sf.neutrality("tanh", 0.1, dps=40)
    with mp.workdps(40):
        assert abs(b - c) < mp.mpf(10) ** -25
        assert abs(mp.mpf(a) - c) < 1e-10 * c


# ---------------------------------------------------------------- phase diagrams
def test_relu_phase_diagram_c_star_one_and_boundary_at_two():
    sw, sb = np.linspace(0.25, 4, 16), np.linspace(0, 0.2, 5)
    pd = sf.phase_diagram("relu", sigma_w2=sw, sigma_b2=sb)
    assert np.all(pd.c_star == 1)
    assert np.all(pd.labels[sw < 2] == "ordered-deep-prejudice")
    assert np.all(pd.labels[sw > 2] == "chaotic-deep-prejudice")
    assert np.all(pd.labels[sw == 2] == "edge-of-chaos")
    assert np.all(pd.eoc == 2) and np.all(np.isnan(pd.neutrality))      # the EOC: sigma_w2 = 2 at every sigma_b2


def test_erf_phase_diagram_agrees_with_pointwise_phase_and_lines():
    sw, sb = np.linspace(0.5, 4, 8), np.array([0.0, 0.05, 0.1])
    pd = sf.phase_diagram("erf", sigma_w2=sw, sigma_b2=sb)
    for i in range(sw.size):
        for j in range(sb.size):
            p = sf.phase("erf", sw[i], sb[j], full=True)
            assert pd.labels[i, j] == p.label and pd.c_star[i, j] == p.c_star
    np.testing.assert_allclose(pd.eoc, sf.eoc_curve("erf", sb), rtol=1e-14)
    np.testing.assert_allclose(pd.neutrality[1:], sf.neutrality("erf", sb[1:]), rtol=1e-14)
    # each side of the neutrality line has its label
    j = 2
    assert np.all(pd.labels[sw > pd.neutrality[j] * 1.01, j] == "neutrality")
    assert np.all(pd.labels[(sw < pd.neutrality[j] * 0.99) & (sw > pd.eoc[j] * 1.01), j] == "prejudice")
    assert pd.counts()["neutrality"] > 0


def test_phase_diagram_bad_input():
    with pytest.raises(ValueError, match="'sigma_w2' parameter of phase_diagram"):
        sf.phase_diagram("erf", sigma_w2=[-1.0], sigma_b2=[0.1])
    with pytest.raises(ValueError, match="'depth' parameter of phase_diagram"):
        sf.phase_diagram("erf", sigma_w2=[1.0], sigma_b2=[0.1], depth=0)


# q* = 0 at sigma_b2 = 0 for psi(0) = 0 and psi'(0) != 0 (gelu, silu, mish): the c-map is the identity to
# leading order as q -> 0, so c freezes where the recursion brings it; oracle: propagate's own recursion on
# its quadrature path (no tables), run until q has underflowed past the freeze.
@pytest.mark.parametrize("name,sw", [("gelu", 1.0), pytest.param("silu", 2.0, marks=pytest.mark.slow),
                                     pytest.param("x*tanh(log(1+exp(x)))", 2.0, marks=pytest.mark.slow)])
def test_c_star_where_q_star_is_zero_is_the_limit_of_the_recursion(name, sw):
    cs = sf.c_star(name, sw, 0.0)
    r = sf.propagate(name, sw, 0.0, 150, layers=[150], method="quadrature")
    assert 0 < r.q[-1] < 1e-8 * sw
    assert abs(float(r.c[-1]) - cs) <= 1e-9
    assert 0.05 < cs < 0.95          # neither the limit map's root (1/2) nor 0 or 1


def test_c_star_quadratic_at_zero_goes_to_the_limit_map_root():
    """x erf(x) ~ (2/sqrt(pi)) x^2 at 0: C/V -> (1 + 2c^2)/3 as q -> 0, whose stable root is 1/2."""
    for sw in (1 / 3, 1.0):             # from c = 0.49 (below the root) and c = 0.56 (above it)
        assert abs(sf.c_star("x*erf(x)", sw, 0.0) - 0.5) <= 1e-6


def test_q_star_where_the_recursion_climbs_away_from_zero():
    """x erf(x) at sigma_w2 = 2, sigma_b2 = 0: q = 0 is a fixed point, but V(q) ~ q for large q, so
    from q^(1) = 2 the variance grows without bound (q* = inf, float64 and dps)."""
    assert sf.q_star("x*erf(x)", 2.0, 0.0) == math.inf
    r = sf.propagate("x*erf(x)", 2.0, 0.0, 30, layers=[30])
    assert r.q[-1] > 1e6
    assert sf.q_star("x*erf(x)", 0.5, 0.0) == 0.0


@pytest.mark.slow
def test_q_star_where_the_recursion_climbs_away_from_zero_dps():
    assert sf.q_star("x*erf(x)", 2.0, 0.0, dps=15) == mp.inf


def test_vroot_reversed_bracket():
    """Brackets may come as (lo, hi) with lo > hi (the c* scan moving down from c^(1))."""
    from symfield.numeric.vroot import vroot
    f = lambda x, j: x * x - 2.0
    x = vroot(f, np.array([1.9, 1.0]), np.array([1.0, 1.9]), np.array([1.61, -1.0]), np.array([-1.0, 1.61]))
    assert np.all(np.abs(x - math.sqrt(2)) <= 4e-16 * math.sqrt(2))


def test_eoc_reports_the_stability_of_its_q_star():
    """tanh: the EOC q* is a stable fixed point of the variance map (slope < 1; = 1 at sigma_b2 = 0).
    x erf(x) at sigma_b2 = 0.02: q* = 0.0936 with slope ~1.38 > 1 (unstable: the recursion from
    q^(1) runs away, sf.q_star is inf there)."""
    e = sf.eoc("tanh", 0.05)
    ref = e.sigma_w2 * float(mp.diff(lambda t: mp_expect1(lambda x: mp.tanh(x) ** 2, t, dps=30), e.q_star))
    assert e.stable and abs(e.q_slope - ref) <= 1e-9
    assert sf.eoc("tanh", 0.0).q_slope == pytest.approx(1.0, abs=1e-12)
    u = sf.eoc("x*erf(x)", 0.02)
    assert not u.stable and 1.3 < u.q_slope < 1.45
    assert sf.q_star("x*erf(x)", u.sigma_w2, 0.02) == math.inf


def test_eoc_homogeneous_dps_and_curve_agree_with_phase():
    """relu at dps=30: sigma_w2 = 2 exactly, q* = +inf; leaky relu (slope 0.5): 1/E[psi'^2] = 2/(1 + 1/4)
    = 8/5 exactly (psi'^2 = 1 on z > 0, 1/4 on z < 0, each half of the mass); the phase there is the edge."""
    e = sf.eoc("relu", 0.2, dps=30)
    assert e.sigma_w2 == 2 and e.q_star == mp.inf and e.q_slope == 1.0
    act = sf.activation("leaky_relu", slope=0.5)
    with mp.workdps(40):
        assert abs(sf.eoc(act, 0.1, dps=30).sigma_w2 - mp.mpf(8) / 5) <= mp.mpf(10) ** -30 * 2
    assert sf.eoc_curve(act, [0.0, 0.1, 0.3]).tolist() == pytest.approx([1.6] * 3, rel=1e-15)
    assert sf.phase(act, 1.6, 0.3) == "edge-of-chaos" and sf.phase(act, 1.59, 0.3) == "ordered-deep-prejudice"


@pytest.mark.parametrize("act", ["tanh", "erf", "sin", "gelu", "softplus", ("tanh", "avg"), ("tanh", "max"),
                                 ("relu", "max")])
def test_c_star_one_by_convexity_matches_the_scan(act, monkeypatch):
    """Points with chi1 < 1 get c* = 1 without a scan (C(q, q, c q) has nonnegative Taylor coefficients in c,
    so f(c) - c is convex on [0, 1]); the scan, run on the same points, finds no root before 1 either."""
    from symfield.theory import cstar   # noqa: PLC0415
    A = sf.activation(act[0], pool=act[1], k=2) if isinstance(act, tuple) else sf.activation(act)
    K = kernel(A)
    # both runs take the same table-lookup path (the rent-or-buy rule could switch to compiled lookups between them)
    monkeypatch.setattr(maps(K), "_ahead", 10**9)
    sw, sb = np.meshgrid(np.linspace(0.1, 4.0, 40), np.linspace(0.0, 0.3, 7))
    sw, sb = sw.ravel(), sb.ravel()
    fast, qs = cstar.c_star_f64(K, sw, sb)
    chi1 = sw * maps(K).dpsi2(np.where((qs > 0) & np.isfinite(qs), qs, 1.0))
    used = cstar._ordered_to_one(maps(K), sw, qs, (qs > 0) & np.isfinite(qs), sb / (sw + sb))
    assert used.sum() >= 20 and np.all(chi1[used] < 1)
    monkeypatch.setattr(cstar, "_ordered_to_one", lambda M, sw, *a: np.zeros(sw.shape, bool))
    slow, _ = cstar.c_star_f64(K, sw, sb)
    np.testing.assert_array_equal(fast == 1, slow == 1)
    # the other roots: the two runs batch C differently, so the ski rental may serve a point from the table in one
    # and from the quadrature in the other (max-pools: Hoeffding's rule costs ~1 ms, so the table is not always
    # built first); both are certified to 1e-12 of the scale
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=0)


def test_max_pool_slope_at_c_one_is_chi1_for_a_non_monotone_phi():
    """The convexity shortcut for max-pools rests on dC/dc at c = 1 being q E[psi'^2] (dpsi2) also where the
    argmax jumps between branches (gelu, non-monotone). C(1) - C(1 - h) = q dpsi2 h + a h^(3/2) + ...: the
    difference quotients of the 4-D level-set rule at h and h/100, extrapolated in sqrt(h), meet the 1-D dpsi2."""
    M = maps(kernel(sf.activation("gelu", pool="max", k=2)))
    for q in (0.3, 2.0):
        c0 = float(M.C_eq(q, 1.0))
        d = [(c0 - float(M.C_eq(q, 1 - h))) / (h * q) for h in (1e-5, 1e-7)]
        assert abs((10 * d[1] - d[0]) / 9 / float(M.dpsi2(q)) - 1) < 2e-5
        assert abs(d[1] / float(M.dpsi2(q)) - 1) > 1e-5      # the sqrt(h) term is there: not a trivial check


@pytest.mark.parametrize("act", ["gelu", "relu", "tanh"])
def test_c_star_limit_rows_share_one_scan(act, monkeypatch):
    """Rows at q* = 0 or inf solve one limit c-map per (q*, c^(1)): solving each row on its own gives the same c*."""
    from symfield.theory import cstar   # noqa: PLC0415
    K = kernel(sf.activation(act))
    # one lookup path for both runs: the rent-or-buy rule times quadrature, so under load it may buy a table
    # between them, and the finite rows' roots then differ in the last bits
    monkeypatch.setattr(maps(K), "_ahead", 10**9)
    sw, sb = np.meshgrid(np.linspace(0.0, 4.0, 21), np.linspace(0.0, 0.2, 4))
    sw, sb = sw.ravel(), sb.ravel()
    shared, qs = cstar.c_star_f64(K, sw, sb)
    lim = (qs == 0) | (qs == np.inf)
    assert lim.sum() >= 3
    monkeypatch.setattr(cstar, "_limit_twins", lambda *a: None)
    alone, _ = cstar.c_star_f64(K, sw, sb)
    np.testing.assert_array_equal(shared[lim], alone[lim])
    np.testing.assert_allclose(shared, alone, rtol=1e-13, atol=0)


@pytest.mark.parametrize("act", ["tanh", "erf", "sin", ("tanh", "avg"), ("tanh", "max")])
def test_c_star_climb_matches_the_scan(act, monkeypatch):
    """Rows whose c rises from c^(1) >= 0 are bracketed by probes 1 - (1 - c^(1)) 4^-j (g convex on [0, 1], so
    its one root below 1 is the first): the same c* as the first sign change of the 64-step scan, and f(c*) = c*."""
    from symfield.theory import cstar   # noqa: PLC0415
    A = sf.activation(act[0], pool=act[1], k=2) if isinstance(act, tuple) else sf.activation(act)
    K = kernel(A)
    monkeypatch.setattr(maps(K), "_ahead", 10**9)     # one lookup path for both runs
    sw, sb = np.meshgrid(np.linspace(0.1, 4.0, 40), np.linspace(0.0, 0.3, 7))
    sw, sb = sw.ravel(), sb.ravel()
    fast, qs = cstar.c_star_f64(K, sw, sb)
    c1 = sb / (sw + sb)
    climbed = (fast < 1) & (fast > c1) & (qs > 0) & np.isfinite(qs)
    assert climbed.sum() >= 5
    monkeypatch.setattr(cstar, "_climbing", lambda c1, g1: np.zeros(c1.shape, bool))
    slow, _ = cstar.c_star_f64(K, sw, sb)
    # two float64 roots of g agree to the maps' rounding over |g'(c*)| (near the EOC g' -> 0: ill-conditioned)
    M, i = maps(K), np.nonzero(climbed)[0]
    h = 1e-6
    slope = np.ones(sw.shape)
    slope[i] = sw[i] * (M.C_eq(qs[i], fast[i] + h) - M.C_eq(qs[i], fast[i] - h)) / (2 * h * qs[i]) - 1.0
    assert np.all(np.abs(fast - slow) <= 1e-13 + 1e-15 / np.abs(slope))
    resid = (sw[i] * M.C_eq(qs[i], fast[i]) + sb[i]) / qs[i] - fast[i]
    assert np.abs(resid).max() < 1e-13


@pytest.mark.parametrize("act", ["tanh", "gelu", "relu", "x*erf(x)", "elu"])
def test_eoc_line_is_eoc_point_at_every_sigma_b2(act):
    """The phase diagram's EOC line (one vectorised root find) equals eoc_point at each sigma_b2, NaN where
    eoc_point raises (x erf(x) at sigma_b2 = 0), and at finite q* it solves chi1 = 1 and q* = sw V(q*) + sb."""
    from symfield.theory.eoc import eoc_line, eoc_point   # noqa: PLC0415
    K = kernel(sf.activation(act))
    sb = np.array([0.0, 0.01, 0.05, 0.2])
    sw, qs = eoc_line(K, sb)
    for i, b in enumerate(sb):
        try:
            w, q = eoc_point(K, float(b))
        except (ValueError, ArithmeticError):
            assert math.isnan(sw[i])
            continue
        assert sw[i] == pytest.approx(w, rel=1e-14) and (qs[i] == q or qs[i] == pytest.approx(q, rel=1e-14))
    M, ok = maps(K), np.nonzero((qs > 0) & (qs < np.inf))[0]
    if ok.size and not K.degree_one:
        np.testing.assert_allclose(sw[ok] * M.dpsi2(qs[ok]), 1.0, rtol=1e-12)
        np.testing.assert_allclose(sw[ok] * M.V(qs[ok]) + sb[ok], qs[ok], rtol=1e-12)


def test_vroot_guard_and_speed():
    """Roots against closed forms: a smooth f converges superlinearly (few evaluations); f = x^21 - 1/2, flat
    near its root and steep at the end, still meets the tolerance with the bisection guard (at most 3 steps
    per halving of the bracket)."""
    from symfield.numeric.vroot import vroot   # noqa: PLC0415
    calls = []

    def f(x, j, n):
        calls.append(x.size)
        return x ** n - 0.5
    for n, most in ((3, 10), (21, 16)):
        calls.clear()
        lo, hi = np.array([0.1, 0.2]), np.array([1.5, 1.1])
        r = vroot(lambda x, j: f(x, j, n), lo, hi, lo ** n - 0.5, hi ** n - 0.5)
        np.testing.assert_allclose(r, 0.5 ** (1 / n), rtol=1e-15)
        assert len(calls) <= most


def test_ordered_max_pool_of_gelu_gets_c_star_one_without_evaluating_C(monkeypatch):
    """Oracle, an exact bound: |gelu'| <= gelu'(sqrt 2) = N(sqrt 2) + sqrt 2 n(sqrt 2) < 1.13, so
    chi1 = sigma_w2 E[phi'(u_A)^2] < 0.64 at sigma_w2 = 0.5 whatever q*; with sigma_b2 > 0 (q* >= sigma_b2 finite)
    the c-map's convexity on [0, 1] (nonnegative Mehler coefficients) leaves no root in [c^(1), 1): c* = 1.
    The engine decides this before any C (a 4-D level-set integral here) is evaluated."""
    from symfield.numeric.maps import Maps
    from symfield.theory.cstar import c_star_f64

    def no_C(self, *args):
        raise AssertionError("C evaluated for a point ordered by convexity")
    monkeypatch.setattr(Maps, "C", no_C)
    sup = float(mp.ncdf(mp.sqrt(2)) + mp.sqrt(2) * mp.npdf(mp.sqrt(2)))
    sw = np.array([0.5, 0.5, 0.2])
    assert (sw * sup ** 2 < 1).all()
    cs, qs = c_star_f64(kernel(sf.activation("gelu", pool="max", k=2)), sw, np.array([0.01, 0.2, 0.05]))
    assert np.isfinite(qs).all() and (qs > 0).all()
    assert (cs == 1.0).all()


def test_q_star_zero_rows_of_a_max_pool_of_gelu_use_the_exact_small_q_limit():
    """gelu(x) = x/2 + O(x^2), so as q -> 0 psi/sqrt(q) -> max(z1, z2)/2 and the normalised c-map at q* = 0 is
    that of M = max(z1, z2): with max = mean + |difference|/2, E[M M'] = c/2 + (sqrt(1 - c^2) + c asin c)/pi and
    E[M^2] = 1 (exact identities). That map is convex with value 1 and slope 1 at c = 1, so from c^(1) = 0 it
    climbs to c* = 1, and chi1 = sigma_w2 E[psi'^2](0+) = sigma_w2/4: ordered. (At q = 1e-8 the maps'
    O(q^(1/2)) remainder put a spurious fixed point at 1 - 1.2e-11 and chi1 1.8e-4 too high.)"""
    from symfield.symbolic.limits import zero_limit_kernel
    from symfield.theory.cstar import c_star_f64
    act = sf.activation("gelu", pool="max", k=2)
    K = kernel(act)
    Z = maps(zero_limit_kernel(K))
    assert float(Z.V(1.0)) == pytest.approx(0.25, rel=1e-15)
    for c in (-0.9, -0.2, 0.4, 0.97):
        exact = (c / 2 + (math.sqrt(1 - c * c) + c * math.asin(c)) / math.pi) / 4
        assert abs(float(Z.C_eq(1.0, c)) - exact) <= 1e-15
    cs, qs = c_star_f64(K, np.array([0.3, 1.0]), np.zeros(2))
    assert (qs == 0).all() and (cs == 1.0).all()
    ph = sf.phase(act, 1.0, 0.0, full=True)
    assert ph.label == "ordered-deep-prejudice" and ph.slope == pytest.approx(0.25, rel=1e-14)


def test_no_small_q_limit_kernel_where_its_c_map_is_the_identity():
    """psi_0 linear (a = b, unpooled or an average): C_0(1, 1, c)/V_0(1) = c, every c a fixed point; c* is
    decided by the next order (the descent or the maps at small q), so no limit kernel is used."""
    from symfield.symbolic.limits import zero_limit_kernel
    for act in ("gelu", sf.activation("tanh", pool="avg", k=2), "relu"):
        assert zero_limit_kernel(kernel(act)) is None


def test_eoc_at_zero_of_a_max_pool_is_exact_and_marginal():
    """gelu+max2 at sigma_b2 = 0: E[psi'^2](0+) = E[psi_0'^2] of psi_0 = max of x/2 over two nodes = 1/4 exactly
    (the gradient is 1/2 on the argmax), so sigma_w2 = 4 and the slope of the variance map at q* = 0 is 1 (not
    1 + 2e-16 from a quadrature at q = 1e-40, which flagged the EOC as an unstable fixed point)."""
    e = sf.eoc(sf.activation("gelu", pool="max", k=2), 0.0)
    assert e.sigma_w2 == 4.0 and e.q_star == 0.0 and e.q_slope == 1.0 and e.note == ""
