"""Float64 and dps= evaluation of every built-in map against oracles (a) literature closed
forms, (b) mpmath quadrature of the defining integral, (c) seeded Monte Carlo."""
import math

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from conftest import TOL, tol_dps
from oracles import REGISTRY, monte_carlo, mp_expect1, mp_expect2

QS = (1e-3, 1.0, 1e3)
PAIRS = [(1.0, 1.0, 0.5), (1e-3, 1e3, 0.3), (2.0, 0.5, -0.999999), (1e3, 1e3, 0.999999),
         (0.7, 1.3, -0.5), (1.0, 1.0, 1.0), (1.0, 1.0, -1.0), (0.5, 2.0, 0.0)]
NAMES = list(REGISTRY)


def _q12(q1, q2, c):
    return c * math.sqrt(q1 * q2)


def _ref1(ent, key, f, qq):
    """Literature value when known, else mpmath quadrature of the defining integral at dps 30."""
    if key in ent:
        with mp.workdps(30):
            return ent[key](mp.mpf(qq)), TOL["closed_float64"]
    return mp_expect1(f, qq, ent.get("kinks", ()), dps=30), TOL["quad_float64"]


@pytest.mark.parametrize("name", NAMES)
def test_one_dimensional_maps_float64(name):
    ent = REGISTRY[name]
    for qq in QS:
        if name.startswith("monomial(4)") and qq > 1:
            continue
        Vref, tol = _ref1(ent, "V", lambda t: ent["phi"](t) ** 2, qq)
        got = sf.V(name, qq)
        assert abs(got - Vref) <= tol * abs(Vref), (name, qq, got, Vref)
        mref, tol = _ref1(ent, "mean", ent["phi"], qq)
        val = sf.map_value(name, "mean", qq)
        assert abs(val - mref) <= tol * math.sqrt(abs(Vref)), (name, qq, val, mref)
        dref, tol = _ref1(ent, "dpsi2", lambda t: ent["dphi"](t) ** 2, qq)
        got = sf.chi1(name, 1.0, 0.0, q=qq)
        assert abs(got - dref) <= tol * abs(dref), (name, qq, got, dref)


@pytest.mark.parametrize("name", [n for n in NAMES if "C" in REGISTRY[n]])
def test_covariance_map_closed_forms_float64(name):
    ent = REGISTRY[name]
    for q1, q2, c in PAIRS:
        if name == "monomial(4)" and max(q1, q2) > 10:
            continue
        q12 = _q12(q1, q2, c)
        with mp.workdps(30):
            ref = ent["C"](mp.mpf(q1), mp.mpf(q2), mp.mpf(q12))
            scale = mp.sqrt(ent["V"](mp.mpf(q1)) * ent["V"](mp.mpf(q2)))
        got = sf.qab_map(name, q1, q2, q12, 1.0, 0.0)
        assert abs(got - ref) <= TOL["closed_float64"] * scale, (name, (q1, q2, c), got, ref)
        if "dC" in ent:
            with mp.workdps(30):
                ref = ent["dC"](mp.mpf(q1), mp.mpf(q2), mp.mpf(q12))
                scale = mp.sqrt(ent["dpsi2"](mp.mpf(q1)) * ent["dpsi2"](mp.mpf(q2)))
            val = sf.map_value(name, "dC", q1, q2, q12)
            assert abs(val - ref) <= TOL["closed_float64"] * scale, (name, (q1, q2, c), val, ref)


QUAD_NAMES = [n for n in NAMES if "C" not in REGISTRY[n]]


@pytest.mark.parametrize("name", QUAD_NAMES)
def test_covariance_map_quadrature_symmetries(name):
    """Exact special cases c = 0 (product of means), c = 1 (= V), and oddness for tanh."""
    for q1, q2 in [(1e-3, 1e3), (1.0, 1.0), (30.0, 0.2)]:
        got0 = sf.C(name, q1, q2, 0.0)
        ent = REGISTRY[name]
        ref0 = mp_expect1(ent["phi"], q1, ent.get("kinks", ()), 30) * mp_expect1(ent["phi"], q2, ent.get("kinks", ()), 30)
        scale = math.sqrt(sf.V(name, q1) * sf.V(name, q2))
        assert abs(got0 - ref0) <= TOL["quad_float64"] * scale
        got1 = sf.C(name, q1, q1, q1)
        assert abs(got1 - sf.V(name, q1)) <= TOL["quad_float64"] * sf.V(name, q1)
    for qq in (1e-3, 1.0, 1e3):
        assert abs(sf.C("tanh", qq, qq, -qq) + sf.V("tanh", qq)) <= 1e-12 * sf.V("tanh", qq)


SLOW_POINTS = [(1e-3, 1.0, 0.3), (2.0, 0.5, -0.999999), (4.0, 4.0, 0.999999), (0.7, 1.3, -0.5)]


@pytest.mark.parametrize("name,point", [("tanh", (1.0, 1.0, 0.5))] + [
    pytest.param(n, p, marks=pytest.mark.slow) for n in QUAD_NAMES for p in SLOW_POINTS])
def test_covariance_map_quadrature_vs_mpmath(name, point):
    """Oracle (b) in 2-D: nested mpmath quadrature (slow: one point by default, the rest with -m slow).

    The oracle's rule has 12 (degree 3) or 24 (degree 4) Gauss-Legendre nodes per two-sd panel; its error
    falls like rho^-(2n) with rho set by phi's nearest complex singularity in sd units (tanh: pi/(2 sqrt(q))).
    For sd > 1 twelve nodes are too few: measured against degree 4/5, degree 3 is off by 6.4e-9 (tanh) and
    2.2e-9 (x*erf(x)) at (4, 4, 0.999999), 2.2e-11 (tanh) at (2, 0.5, -0.999999); degree 4 agrees with
    degree 5 to 1e-16 there."""
    ent = REGISTRY[name]
    q1, q2, c = point
    q12 = _q12(q1, q2, c)
    ref = mp_expect2(ent["phi"], ent["phi"], q1, q2, q12, ent.get("kinks", ()), dps=20,
                     degree=3 if max(q1, q2) <= 1.5 else 4)
    got = sf.C(name, q1, q2, q12)
    scale = math.sqrt(sf.V(name, q1) * sf.V(name, q2))
    assert abs(got - ref) <= TOL["quad_float64"] * scale, (got, ref)


@pytest.mark.parametrize("name", NAMES)
def test_monte_carlo(name):
    ent = REGISTRY[name]
    for q1, q2, c in PAIRS:
        if name.startswith("monomial") and max(q1, q2) > 10:
            continue  # heavy tails: the Monte Carlo standard error is unreliable there
        q12 = _q12(q1, q2, c)
        est, se = monte_carlo(ent["np_phi"], ent["np_phi"], q1, q2, q12, seed=1)
        got = sf.C(name, q1, q2, q12)
        assert abs(got - est) <= TOL["mc_sigmas"] * se + TOL["mc_floor"] * abs(est), (name, (q1, q2, c), got, est, se)
        est, se = monte_carlo(ent["np_dphi"], ent["np_dphi"], q1, q1, q1, seed=2)
        got = sf.chi1(name, 1.0, 0.0, q=q1)
        assert abs(got - est) <= TOL["mc_sigmas"] * se + TOL["mc_floor"] * abs(est), (name, q1, got, est, se)


@pytest.mark.parametrize("N", [15, 30, 50])
@pytest.mark.parametrize("name,point", [("erf", (0.7, 1.3, -0.4)), ("relu", (2.0, 0.5, 0.9)),
                                        ("sin", (1.5, 0.5, 0.2))])
def test_dps_closed_forms_give_requested_digits(N, name, point):
    a = sf.qab_map(name, *point, 1.5, 0.1, dps=N)
    b = sf.qab_map(name, *point, 1.5, 0.1, dps=N + 20)
    with mp.workdps(N + 20):
        assert abs(a - b) <= tol_dps(N) * abs(b)


@pytest.mark.parametrize("N", [15, 30, 50])
def test_dps_quadrature_1d_gives_requested_digits(N):
    a = sf.q_map("tanh", 0.8, 1.5, 0.1, dps=N)
    b = sf.q_map("tanh", 0.8, 1.5, 0.1, dps=N + 20)
    with mp.workdps(N + 20):
        assert abs(a - b) <= tol_dps(N) * abs(b)
        ref = mp.mpf("1.5") * mp_expect1(lambda t: mp.tanh(t) ** 2, mp.mpf("0.8"), dps=N + 20) + mp.mpf("0.1")
        assert abs(a - ref) <= tol_dps(N) * abs(ref)


@pytest.mark.parametrize("N", [15, pytest.param(30, marks=pytest.mark.slow)])
def test_dps_quadrature_2d_gives_requested_digits(N):
    a = sf.qab_map("tanh", 1.0, 1.0, 0.5, 1.0, 0.0, dps=N)
    b = sf.qab_map("tanh", 1.0, 1.0, 0.5, 1.0, 0.0, dps=N + 20)
    with mp.workdps(N + 20):
        assert abs(a - b) <= tol_dps(N) * abs(b)


def test_vectorised_over_arrays():
    qs = np.array([[0.1, 1.0], [10.0, 100.0]])
    out = sf.q_map("tanh", qs, 1.2, 0.05)
    assert out.shape == (2, 2)
    for i in np.ndindex(2, 2):
        assert out[i] == pytest.approx(float(sf.q_map("tanh", qs[i], 1.2, 0.05)), rel=1e-14)
    sw = np.linspace(0.5, 3, 5)[:, None]
    assert sf.q_map("relu", 1.0, sw, np.array([0.0, 0.1])).shape == (5, 2)


def test_elu_one_dimensional_maps_at_large_q_in_float64(monkeypatch):
    """elu's V, E[psi'^2] and E[psi] contain exp(2q) erfc(sqrt(2q)): float64 without overflow up to q = 1e6
    (no point redone in mpmath), against mpmath quadrature of the defining integrals at 30 digits."""
    from symfield.numeric import evaluate as E
    from symfield.numeric.maps import maps
    M = maps(sf.kernel("elu"))
    q = np.array([0.5, 30.0, 400.0, 3e3, 1e6])
    M.V(q[:1]), M.dpsi2(q[:1]), M.mean(q[:1])       # the evaluators built; below, only run
    monkeypatch.setattr(E, "evaluator", lambda *a: pytest.fail("a float64 point was redone in mpmath"))
    got = {"V": M.V(q), "dpsi2": M.dpsi2(q), "mean": M.mean(q)}
    elu = lambda x: x if x > 0 else mp.expm1(x)  # noqa: E731
    fs = {"V": lambda x: elu(x) ** 2, "dpsi2": lambda x: 1 if x > 0 else mp.exp(2 * x), "mean": elu}
    for name, f in fs.items():
        for i, qi in enumerate(q):
            with mp.workdps(30):
                s = mp.sqrt(qi)
                ref = mp.quad(lambda x: f(x) * mp.npdf(x, 0, s), [-40 * s, -40, -1, 0, 1, 40 * s])
            assert abs(got[name][i] - ref) <= 1e-14 * abs(ref), (name, qi, got[name][i], ref)
