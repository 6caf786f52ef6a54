"""Fixed points of the variance map with several roots (gelu, silu-like): q* is the attractor the
recursion reaches from q^(1), checked against the recursion iterated on mpmath quadrature of the
defining integral V(q) = E[phi(sqrt(q) z)^2]."""
import math

import mpmath
import pytest

import symfield as sf


def _gelu(x):
    return x * (1 + mpmath.erf(x / mpmath.sqrt(2))) / 2


def _V(phi, q):
    f = lambda z: phi(mpmath.sqrt(q) * z) ** 2 * mpmath.exp(-z * z / 2)
    return mpmath.quad(f, [-mpmath.inf, 0, mpmath.inf]) / mpmath.sqrt(2 * mpmath.pi)


def _iterate(phi, sw, sb, layers, q0=1.0):
    q = sw * q0 + sb
    for _ in range(layers - 1):
        q = sw * _V(phi, q) + sb
    return q


@pytest.mark.parametrize("sw, sb", [(2.05, 0.05), pytest.param(2.1, 0.05, marks=pytest.mark.slow)])
def test_gelu_q_star_is_the_attractor_the_recursion_reaches(sw, sb):
    with mpmath.workdps(20):
        limit = _iterate(_gelu, sw, sb, 400)
        step = sw * _V(_gelu, limit) + sb - limit
    assert abs(step) < 1e-12                    # the mpmath recursion has converged
    assert sf.q_star("gelu", sw, sb) == pytest.approx(float(limit), rel=1e-10)
    assert sf.phase("gelu", sw, sb) == "ordered-deep-prejudice"


def test_gelu_fixed_points_lists_both_roots_with_their_stability():
    fp = sf.fixed_points("gelu", 2.05, 0.05)
    assert len(fp.roots) == 2 and fp.stable == (True, False)
    with mpmath.workdps(20):
        for r in fp.roots:            # each is a root of g(q) = sw V(q) + sb - q (mpmath quadrature)
            assert abs(2.05 * _V(_gelu, r) + 0.05 - r) < 1e-12 * max(1, r)
        # stability from the slope of the map: finite difference of the quadrature
        for r, s in zip(fp.roots, fp.slopes):
            h = mpmath.mpf(r) * 1e-6
            d = 2.05 * (_V(_gelu, r + h) - _V(_gelu, r - h)) / (2 * h)
            assert float(d) == pytest.approx(s, rel=1e-6)
    assert fp.q_star == pytest.approx(fp.roots[0], rel=1e-12)
    assert fp.basin[0] == 0 and fp.basin[1] == pytest.approx(fp.roots[1], rel=1e-12)
    # from above the unstable root the variance runs away
    assert sf.fixed_points("gelu", 2.05, 0.05, q0=2 * fp.roots[1]).q_star == math.inf


def test_single_root_activations_keep_their_q_star():
    with mpmath.workdps(20):
        limit = _iterate(mpmath.tanh, 1.5, 0.05, 300)
    assert sf.q_star("tanh", 1.5, 0.05) == pytest.approx(float(limit), rel=1e-10)
    assert sf.q_star("relu", 1.5, 0.1) == pytest.approx(0.1 / (1 - 0.75), rel=1e-12)
    assert sf.q_star("relu", 2.5, 0.1) == math.inf


def test_unstable_eoc_says_so_and_the_depth_eoc_makes_the_product_one():
    e = sf.eoc("gelu", 0.05)
    assert not e.stable and "eoc_depth" in e.note
    d = sf.eoc_depth("gelu", 0.05, 10)
    with mpmath.workdps(20):             # prod over layers of sw E[phi'(sqrt(q) z)^2], mpmath quadrature
        dphi = lambda x: (1 + mpmath.erf(x / mpmath.sqrt(2))) / 2 + x * mpmath.exp(-x * x / 2) / mpmath.sqrt(2 * mpmath.pi)
        q, prod = d.sigma_w2 + 0.05, mpmath.mpf(1)
        for layer in range(10):
            if layer:
                q = d.sigma_w2 * _V(_gelu, q) + 0.05
            prod *= d.sigma_w2 * _V(dphi, q)
    assert float(prod) == pytest.approx(1, abs=1e-9)


def test_chi1_at_infinite_q_star_is_the_limit_slope():
    assert sf.q_star("gelu", 2.5, 0.05) == math.inf
    assert float(sf.chi1("gelu", 2.5, 0.05)) == pytest.approx(1.25, rel=1e-12)   # relu's sigma_w2/2
    assert float(sf.phase("gelu", 2.5, 0.05, full=True).slope) == pytest.approx(1.25, rel=1e-12)


@pytest.mark.parametrize("act", ["tanh", "relu", "gelu"])
def test_sigma_w2_zero_is_ordered_deep_prejudice_origin_included(act):
    """sigma_w2 = 0: every input gives the same pre-activations, so c* = 1 exactly and chi1 = 0."""
    for sb in (0.0, 0.1):
        p = sf.phase(act, 0.0, sb, full=True)
        assert (p.label, p.c_star, p.slope, p.gamma_star) == ("ordered-deep-prejudice", 1.0, 0.0, math.inf)
        assert "sigma_w2 = 0" in p.note


def test_vanishing_signal_corner_is_labelled_by_c_star_and_says_so():
    """tanh at the PyTorch default (1/3, 0): q* = 0, chi1 -> sigma_w2 phi'(0)^2 = 1/3 exactly, and
    c = 0 at every layer from orthogonal inputs (tanh is odd and sigma_b2 = 0): neutrality, with a note."""
    p = sf.phase("tanh", 1 / 3, 0.0, full=True)
    assert p.label == "neutrality" and p.q_star == 0 and p.c_star == 0
    assert p.slope == pytest.approx(1 / 3, rel=1e-6)
    assert "q* = 0" in p.note and "c* alone" in p.note
    assert sf.phase("tanh", 1.5, 0.05, full=True).note == ""          # Table 1 applies as it stands


def test_several_roots_are_listed_in_the_phase_note():
    note = sf.phase("gelu", 2.05, 0.05, full=True).note
    assert "0.130706 (stable" in note and "unstable" in note


@pytest.mark.timeout(60)
def test_overflowing_first_layer_gives_nan_not_a_loop():
    """sigma_w2 q0 + sigma_b2 overflows: q* is undefined (NaN), found at once (it once looped forever)."""
    assert math.isnan(sf.q_star("tanh", 1e308, 1e308))
    assert sf.q_star("tanh", 1e300, 1e300) == pytest.approx(2e300, rel=1e-12)   # V(q) -> 1: q* = sw + sb


def test_q_star_zero_descent_builds_its_table_in_one_round(monkeypatch, tmp_path):
    """x erf(x) at (1/3, 0): q* = 0, and the descent q' = sigma_w2 V(q) crosses ~25 octaves in a few layers.
    The table is grown once over the whole descent (one round of mpmath spot checks, ~3 s each round), not
    once per layer; panel 0 is refused for x erf(x) (C ~ q^2), so the descent below 2^-8 uses quadrature.
    c* is the stable root 1/2 of the q -> 0 limit map (1 + 2c^2)/3 (exact)."""
    from symfield.core import caches
    from symfield.numeric import tables
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    monkeypatch.setenv("SYMFIELD_SHIPPED", "0")
    caches.clear()
    rounds = []
    checks = tables.Table._mp_checks
    monkeypatch.setattr(tables.Table, "_mp_checks", lambda self, built, n=None: (rounds.append(sorted(built)),
                                                                               checks(self, built, n))[1])
    try:
        assert abs(sf.c_star("x*erf(x)", 1 / 3, 0.0) - 0.5) <= 1e-6
    finally:
        caches.clear()
    assert rounds == [list(range(1, tables.panel_of(1 / 3) + 1))], rounds     # panels 1..7, q in [2^-8, 1/2)
