"""The edge of chaos of positively homogeneous psi (psi(t u) = t psi(u), t > 0): chi1 = sigma_w2 E[psi'^2]
does not depend on q, so the EOC is the vertical line sigma_w2 = 1/E[psi'^2] at every sigma_b2, with q*
infinite there for sigma_b2 > 0 (docs/theory.md sections 5, 6; Bassi et al. draw ReLU's at sigma_w2 = 2).

Oracles: E[psi'^2] and V(1) = E[psi^2] by mpmath quadrature of their defining Gaussian integrals
(split where psi' jumps; the max-pool's on the density of the maximum), a seeded Monte Carlo for the
max-pool, and the exact identity 1/E[1{z > 0}] = 2."""
import json
import math
import subprocess
import sys

import mpmath
import numpy as np
import pytest

import symfield as sf

SB = (0.0, 0.01, 0.1, 1.0, 5.0)


def _gauss(f, dps=30):
    """E[f(z)], z ~ N(0, 1), by mpmath quadrature split at 0 (where the psi' of these psi jump)."""
    with mpmath.workdps(dps):
        return mpmath.quad(lambda z: f(z) * mpmath.npdf(z), [-mpmath.inf, 0, mpmath.inf])


def _max2(f, dps=30):
    """E[f(max(u1, u2))], u1, u2 iid N(0, 1), by 1-D mpmath quadrature on the density 2 phi(t) Phi(t)
    of the maximum of two (split at 0)."""
    with mpmath.workdps(dps):
        return mpmath.quad(lambda t: f(t) * 2 * mpmath.npdf(t) * mpmath.ncdf(t), [-mpmath.inf, 0, mpmath.inf])


def _leaky(a):
    return sf.activation("leaky_relu", slope=a)


def _relu_max2():
    return sf.activation("relu", pool="max", k=2)


# E[psi'^2] of the defining integral: psi'(z) = 1 (z > 0), a (z < 0); abs: psi'^2 = 1
DPSI2 = {"relu": lambda: _gauss(lambda z: 1 if z > 0 else 0),
         "abs": lambda: _gauss(lambda z: 1),
         "linear": lambda: _gauss(lambda z: 1),
         "leaky_relu(0.01)": lambda: _gauss(lambda z: 1 if z > 0 else mpmath.mpf("0.01") ** 2),
         "leaky_relu(0.3)": lambda: _gauss(lambda z: 1 if z > 0 else mpmath.mpf("0.3") ** 2)}
ACTS = {"relu": "relu", "abs": "abs", "linear": "linear",
        "leaky_relu(0.01)": _leaky(0.01), "leaky_relu(0.3)": _leaky(0.3)}


@pytest.mark.parametrize("name", list(ACTS))
def test_single_node_eoc_is_one_over_dpsi2_at_every_bias(name):
    act, d = ACTS[name], DPSI2[name]()
    for sb in SB:
        e = sf.eoc(act, sb)
        assert e.sigma_w2 == pytest.approx(float(1 / d), rel=1e-15), (name, sb)
        assert e.q_star == (math.inf if sb > 0 else 0.0)
        assert e.q_slope == 1.0 and e.stable        # single node: V(q) = q E[psi'^2], q' = q + sigma_b2
        assert "positively homogeneous" in e.note and "every q is a fixed point" in e.note


def test_relu_eoc_is_exactly_two_with_infinite_q_star():
    for sb in SB[1:]:
        e = sf.eoc("relu", sb)
        assert e.sigma_w2 == 2.0 and e.q_star == math.inf
        assert sf.q_star("relu", e.sigma_w2, sb) == math.inf
        # below the line q* = sigma_b2/(1 - sigma_w2/2) (docs/theory.md section 5) is finite and diverges at 2
        assert sf.q_star("relu", 2 - 1e-6, sb) == pytest.approx(sb / 5e-7, rel=1e-8)
    e0 = sf.eoc("relu", 0.0)
    assert (e0.sigma_w2, e0.q_star) == (2.0, 0.0) and "q* = 0 reported" in e0.note


def test_leaky_relu_closed_form_and_dps30():
    for a in (0.01, 0.3, 0.7):
        with mpmath.workdps(40):
            d = _gauss(lambda z: 1 if z > 0 else mpmath.mpf(str(a)) ** 2, dps=40)
            assert abs(d - (1 + mpmath.mpf(str(a)) ** 2) / 2) < mpmath.mpf(10) ** -38    # the oracle itself
            for sb in (0.0, 0.1, 2.0):
                e = sf.eoc(_leaky(a), sb, dps=30)
                assert isinstance(e.sigma_w2, mpmath.mpf)
                assert abs(e.sigma_w2 - 1 / d) <= mpmath.mpf(10) ** -29 * (1 / d), (a, sb)
                assert e.q_star == (mpmath.inf if sb > 0 else 0)


def test_relu_and_abs_dps30_exact():
    for sb in (0.0, 0.1, 0.5):
        assert sf.eoc("relu", sb, dps=30).sigma_w2 == 2          # exact rational: 1/(1/2)
        assert sf.eoc("abs", sb, dps=30).sigma_w2 == 1
        assert sf.eoc("relu", sb, dps=30).q_star == (mpmath.inf if sb > 0 else 0)
    with mpmath.workdps(30):
        assert sf.eoc("relu", 0.1, dps=30).sigma_b2 == mpmath.mpf("0.1")      # the decimal it prints as


def test_relu_max2_eoc_four_thirds_by_quadrature_and_monte_carlo():
    d = _max2(lambda t: 1 if t > 0 else 0)                  # |grad max(relu(u1), relu(u2))|^2 = 1{max > 0}
    assert abs(d - mpmath.mpf(3) / 4) < 1e-15
    u = np.random.default_rng(7).standard_normal((2, 400_000))
    hit = (u.max(axis=0) > 0).astype(float)
    assert abs(hit.mean() - 0.75) < 5 * hit.std() / math.sqrt(hit.size)
    v = _max2(lambda t: max(t, 0) ** 2)                     # V(1) = E[max(u1, u2, 0)^2]
    assert abs(v - (mpmath.mpf(3) / 4 + 1 / (2 * mpmath.pi))) < 1e-15
    act = _relu_max2()
    for sb in (0.0, 0.1, 1.0):
        e = sf.eoc(act, sb)
        assert e.sigma_w2 == pytest.approx(float(1 / d), rel=1e-15)
        assert e.q_star == math.inf                              # q_growth = V(1)/E[psi'^2] > 1: q runs away
        assert e.q_slope == pytest.approx(float(v / d), rel=1e-12) and not e.stable
        assert "q grows geometrically" in e.note
        assert sf.q_star(act, e.sigma_w2, sb) == math.inf
    with mpmath.workdps(40):
        e30 = sf.eoc(act, 0.1, dps=30)
        assert abs(e30.sigma_w2 - mpmath.mpf(4) / 3) <= mpmath.mpf(10) ** -29
        assert e30.q_star == mpmath.inf


def test_eoc_curve_is_a_vertical_line():
    sb = np.array([0.0, 0.05, 0.1, 1.0])
    assert sf.eoc_curve("relu", sb).tolist() == [2.0] * 4
    np.testing.assert_allclose(sf.eoc_curve(_relu_max2(), sb), 4 / 3, rtol=1e-15)
    out = sf.eoc_curve("relu", sb[1:], dps=30)
    assert out.dtype == object and all(isinstance(v, mpmath.mpf) and v == 2 for v in out)
    assert sf.eoc_curve(_leaky(0.3), [[0.1, 0.2]]).shape == (1, 2)


@pytest.mark.parametrize("act", ["relu", "abs", _leaky(0.3)], ids=["relu", "abs", "leaky0.3"])
def test_phase_agrees_with_eoc(act):
    for sb in (0.0, 0.01, 0.1, 1.0):
        w = sf.eoc(act, sb).sigma_w2
        assert sf.phase(act, w, sb) == "edge-of-chaos"
        assert sf.phase(act, w * (1 - 1e-3), sb) == "ordered-deep-prejudice"
        assert sf.phase(act, w * (1 + 1e-3), sb) == "chaotic-deep-prejudice"
    assert sf.phase("relu", 2, 0.1, eoc_tol=0) == "edge-of-chaos"             # chi1 = 2 * 1/2 exactly
    pd = sf.phase_diagram(act, [1.0, 2.0, 3.0], [0.0, 0.05, 0.1])
    assert pd.eoc.tolist() == [sf.eoc(act, b).sigma_w2 for b in (0.0, 0.05, 0.1)]


def test_relu_max2_phase_agrees_with_eoc():
    act = _relu_max2()
    for sb in (0.0, 0.1):
        w = sf.eoc(act, sb).sigma_w2
        assert sf.phase(act, w, sb) == "edge-of-chaos"          # the chi1 = 1 criterion, not q_growth = 1
        assert sf.phase(act, w * (1 - 1e-3), sb) == "ordered-deep-prejudice"
        assert sf.phase(act, w * (1 + 1e-3), sb) == "chaotic-deep-prejudice"
    pd = sf.phase_diagram(act, [4 / 3], [0.0])      # (sigma_b2 > 0 adds the neutrality search: ~20 s)
    assert pd.labels.tolist() == [["edge-of-chaos"]] and pd.eoc.tolist() == [sf.eoc(act, 0.0).sigma_w2]


def test_tanh_eoc_unchanged_and_solves_both_equations():
    """tanh is not homogeneous: its EOC is the finite (sigma_w2, q*) root, checked against mpmath."""
    e = sf.eoc("tanh", 0.1)
    assert e.note == "" and 0 < e.q_star < math.inf
    assert e.sigma_w2 == pytest.approx(1.9860726411358647, rel=1e-14)            # value before this change
    with mpmath.workdps(30):
        s = mpmath.sqrt(e.q_star)
        d = _gauss(lambda z: mpmath.sech(s * z) ** 4)
        v = _gauss(lambda z: mpmath.tanh(s * z) ** 2)
    assert float(e.sigma_w2 * d) == pytest.approx(1, abs=1e-12)                       # chi1(q*) = 1
    assert float(e.sigma_w2 * v + 0.1) == pytest.approx(e.q_star, rel=1e-12)        # q* fixed point
    assert sf.eoc_curve("tanh", [0.1]).tolist() == [e.sigma_w2]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "symfield", *args], capture_output=True, text=True, timeout=300)


def test_cli_eoc_relu_prints_the_line():
    r = _cli("eoc", "relu", "--sigma-b2", "0.1", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert float(d["sigma_w2"]) == 2.0 and float(d["q_star"]) == math.inf
    r = _cli("eoc-curve", "relu", "--sigma-b2", "0:0.2:3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["sigma_w2"] == [2.0, 2.0, 2.0] and d["errors"] == 0


def test_eoc_curve_full_gives_q_star_that_solves_both_equations():
    """eoc_curve(full=True) against mpmath quadrature of the two defining equations at each point:
    q* = sigma_w2 E[tanh^2] + sigma_b2 and sigma_w2 E[sech^4] = 1 (x ~ N(0, q*)); relu's line is q* = inf."""
    import mpmath
    sb = np.array([0.02, 0.05, 0.3])
    c = sf.eoc_curve("tanh", sb, full=True)
    assert np.array_equal(c.sigma_w2, sf.eoc_curve("tanh", sb))
    for b, w, q in zip(sb, c.sigma_w2, c.q_star):
        with mpmath.workdps(30):
            s = mpmath.sqrt(q)
            e = lambda f: mpmath.quad(lambda z: f(s * z) * mpmath.npdf(z), [-mpmath.inf, 0, mpmath.inf])
            assert abs(w * e(lambda t: mpmath.tanh(t) ** 2) + b - q) <= 1e-12 * q
            assert abs(w * e(lambda t: mpmath.sech(t) ** 4) - 1) <= 1e-12
    r = sf.eoc_curve("relu", [0.0, 0.1], full=True)
    assert list(r.sigma_w2) == [2.0, 2.0] and list(r.q_star) == [0.0, np.inf]
