"""The two-input finite-width theory near c = 1 (issue 28, items 2, 3, 9, 10): float64 against mpmath at
30 digits (the same binary inputs, passed to dps= as mpf), exact identities of identical inputs, and
1-D mpmath quadrature of the small-d limits of the rotated ingredients."""
import json
import warnings

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from symfield.numeric import gram_near as near
from symfield.theory.width_gain import ExpansionWarning

import tanh_series
from oracles import mp_expect2

N = 100


def pair(act, sw, sb, depth, gap):
    """float64 and dps=30 runs from the same binary input q0 = (1, 1, 1 - gap)."""
    qab = 1.0 - gap
    f = sf.gram_fluctuations(act, sw, sb, depth, q0=(1.0, 1.0, qab))
    m = sf.gram_fluctuations(act, sw, sb, depth, q0=(1.0, 1.0, mp.mpf(qab)), dps=30)
    return f, m


def rel(a, b, floor=0.0):
    """max |a - b| / max(|b|, floor * max|b|), b in mpmath."""
    a, b = np.ravel(np.asarray(a, dtype=object)), np.ravel(np.asarray(b, dtype=object))
    with mp.workdps(40):
        scale = max(abs(mp.mpf(v)) for v in b)
        return max(float(abs(mp.mpf(float(x)) - mp.mpf(y)) / max(abs(mp.mpf(y)), floor * scale, mp.mpf(10) ** -300))
                   for x, y in zip(a, b))


def check_against_dps(f, m, c_tol, k1_tol):
    assert np.all(f.c <= 1) and np.all(f.c_mean(N) <= 1)
    for l in range(len(f.layers)):
        assert rel(f.K1[l], m.K1[l], 1.0) < k1_tol          # relative to the layer's largest |K1| entry
        assert rel(f.gram_cov[l], m.gram_cov[l], 1e-30) < c_tol
        assert rel(f.c_var(N)[l], m.c_var(N)[l], 1e-30) < 2 * c_tol or float(m.c_var(N)[l]) == 0
        assert rel(f.one_minus_c[l], m.one_minus_c[l]) < c_tol
        assert rel(f.one_minus_c_mean(N)[l], m.one_minus_c_mean(N)[l]) < c_tol


# ---------------------------------------------------------------- float64 against 30 digits
@pytest.mark.parametrize("gap", [1e-4, 1e-8, 1e-12])
def test_relu_near_c1_float64_matches_dps30(gap):
    """The reproducer of issue 28 (old code: c_mean 1.0000024 > 1, K1_ab 3.47e-4 against -1.0e-15)."""
    f, m = pair("relu", 2.0, 0.0, 6, gap)
    assert not f.status.any() and not m.status.any()
    check_against_dps(f, m, 1e-12, 1e-8)


@pytest.mark.parametrize("gap", [1e-4, 1e-8, 1e-12])
def test_smooth_rule_near_c1_float64_matches_dps30(gap):
    """sin: a smooth activation whose ingredients all have closed forms, so dps=30 is fast; float64 uses the
    mean-value rule (the one tanh uses)."""
    f, m = pair("sin", 1.0, 0.0, 6, gap)
    assert not f.status.any()
    check_against_dps(f, m, 1e-12, 1e-12)
    assert near.near_rule(sf.activation("sin")).method.startswith("mean-value")


@pytest.mark.slow        # ~16 s; relu near c = 1 against dps = 30 stays in the default run (three gaps)
def test_relu_near_c1_20000_layers_has_the_exact_vertex_and_c_below_1():
    """Old code: c_mean(1000)[-1] = 1.00519 with status 0 at q0 = (1, 1, 0.3), depth 20000; 30 digits: 0.99999989.
    ReLU at (2, 0): n Var(Ghat_aa)/K^2 = 5 (l - 1) + 2 exactly."""
    g = sf.gram_fluctuations("relu", 2.0, 0.0, 20000, q0=(1.0, 1.0, 0.3))
    l = g.layers
    np.testing.assert_allclose(g.gram_cov[:, 0, 0] / g.K[:, 0] ** 2, 5 * (l - 1) + 2, rtol=1e-10)
    assert np.all(g.c_mean(1000) <= 1) and np.all(g.one_minus_c > 0)
    # 1 - c ~ 9 pi^2/(2 l^2) (docs/theory.md section 7): the relative accuracy of 1 - c at depth 20000
    assert g.one_minus_c[-1] * l[-1] ** 2 == pytest.approx(9 * np.pi ** 2 / 2, rel=2e-2)
    assert not g.status.any()


@pytest.mark.slow
@pytest.mark.timeout(2400)   # the dps = 30 reference: 570-861 s per row measured with both cores shared
def test_relu_near_c1_depth_10000_matches_dps30():
    f, m = pair("relu", 2.0, 0.0, 10000, 1e-12)
    assert not f.status.any()
    for get in (lambda g: g.one_minus_c, lambda g: g.one_minus_c_mean(N), lambda g: g.c_var(N)):
        assert rel(get(f)[-1], get(m)[-1]) < 1e-9
    assert rel(f.K1[-1], m.K1[-1], 1.0) < 1e-8


# ---------------------------------------------------------------- tanh against the series oracle (tests/tanh_series.py)
TANH_EOC = (1.760954639606742, 0.05)     # tanh's edge of chaos at sigma_b2 = 0.05: 1 - c stays ~1.4 gap forever


def check_against_series(f, sw, sb, depth, gap, layers, c_tol, k1_tol):
    """float64 against tanh_series (its own recursion at 70 digits, ingredients by Price's series) at ``layers``."""
    ls, K, K1, cov = tanh_series.recursion(sw, sb, (1.0, 1.0, 1.0 - gap), depth, every=layers)
    stats = tanh_series.c_statistics(K, K1, cov, N)
    assert not f.status.any()
    assert np.all(f.c <= 1) and np.all(f.c_mean(N) <= 1)
    for i, l in enumerate(ls - 1):
        w, wm, var = stats[i]
        assert rel(f.one_minus_c[l], w) < c_tol
        assert rel(f.one_minus_c_mean(N)[l], wm) < c_tol
        assert rel(f.c_var(N)[l], var) < 2 * c_tol
        assert rel(f.K1[l], K1[i], 1.0) < k1_tol
        assert rel(f.gram_cov[l], cov[i], 1e-30) < c_tol
    return ls, stats


@pytest.mark.parametrize("gap", [1e-4, 1e-8, 1e-12])
def test_tanh_near_c1_float64_matches_the_series_oracle(gap):
    """The tanh rows of the near-c = 1 table at depth 6 (the mean-value rule against 70-digit Price series)."""
    sw, sb = TANH_EOC
    f = sf.gram_fluctuations("tanh", sw, sb, 6, q0=(1.0, 1.0, 1.0 - gap))
    check_against_series(f, sw, sb, 6, gap, None, 1e-12, 1e-8)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("depth, gap", [(100, 1e-4), (100, 1e-8), (100, 1e-12), (10000, 1e-12)])
def test_tanh_near_c1_deep_float64_matches_the_series_oracle(depth, gap):
    sw, sb = TANH_EOC
    f = sf.gram_fluctuations("tanh", sw, sb, depth, q0=(1.0, 1.0, 1.0 - gap))
    layers = None if depth <= 100 else [0, 9, 99, 999, depth - 1]
    check_against_series(f, sw, sb, depth, gap, layers, 1e-11, 1e-8)


def test_series_oracle_against_two_dimensional_quadrature():
    """The oracle's Price series at c = 0.9967 against mpmath's nested Gauss-Legendre rule, 25 digits."""
    lay = tanh_series.TanhLayer(28)
    with mp.workdps(40):
        q, s = mp.mpf("0.6"), mp.mpf("0.598")
        sech2 = lambda x: 1 / mp.cosh(x) ** 2                      # noqa: E731
        for f, g, fn, gn in [((0,), (0,), mp.tanh, mp.tanh), ((1,), (1,), sech2, sech2),
                             ((0, 0, 0), (0,), lambda x: mp.tanh(x) ** 3, mp.tanh)]:
            want = mp_expect2(fn, gn, q, q, s, dps=32, degree=4)
            assert abs(lay.expect(f, g, q, q - s) - want) < mp.mpf(10) ** -25 * abs(want)


def test_arc_rule_flags_k1_beyond_its_promise():
    """At 1 - c ~ 1e-14 the relu K1 d-entry loses more than 1e-8 (its d^(3/2) terms cancel to d^2): status 1,
    while the c statistics stay at float64 accuracy."""
    f, m = pair("relu", 2.0, 0.0, 4, 2.0 ** -47)
    assert f.status[-1] == 1 and not m.status.any()
    assert rel(f.c_var(N)[-1], m.c_var(N)[-1]) < 1e-12
    assert rel(f.one_minus_c_mean(N)[-1], m.one_minus_c_mean(N)[-1]) < 1e-12


def test_no_rule_near_c1_is_flagged():
    """elu has no near rule (kink with a jump in psi''): its (aa, bb, ab) ingredients at 1 - c = 1e-7 are flagged."""
    g = sf.gram_fluctuations("elu", 1.5, 0.1, 3, q0=(1.0, 1.0, 1 - 1e-7))
    assert g.status[-1] == 1
    g = sf.gram_fluctuations("elu", 1.5, 0.1, 3, q0=(1.0, 1.0, 0.2))
    assert not g.status.any()
    assert near.near_rule(sf.activation("elu")) is None


# ---------------------------------------------------------------- the rotated ingredients against independent oracles
@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_near_rules_agree_with_the_plain_ingredients_where_those_are_accurate(act):
    from symfield.theory.gram import _Eval   # noqa: PLC0415  (the (aa, bb, ab) ingredients)
    A = sf.activation(act)
    rule, ev = near.near_rule(A), _Eval(A, None)
    K = np.array([[1.0, 1.0, 0.98], [2.5, 2.5, 2.48], [0.7, 0.9, 0.78]])
    F, J, H, S, _ = ev.layer_terms(K)
    Kr = near.rotate(K)
    assert rule.near(Kr).all()
    for got, want in zip(rule.terms(Kr), (near.rotate(F),) + near.rotate_terms(J, H, S)):
        for g, w in zip(got, want):
            assert np.abs(g - w).max() <= 1e-12 * np.abs(w).max()


def test_tanh_rule_keeps_relative_digits_as_d_goes_to_0():
    """At d = 1e-12 q the rotated entries equal their d -> 0 limits (1-D mpmath integrals) to O(d):
    F~_yy/d = E psi'^2, Sigma~_yy,yy/d^2 = 3 E psi'^4 - (E psi'^2)^2, J~_yy,yy = E psi'^2,
    H~_yy;yy,yy = E[psi' psi''']/2, J~_xx,xx = d<psi^2>/dq."""
    q, d = 0.8, 0.8e-12
    F, J, H, S = near.near_rule(sf.activation("tanh")).terms(np.array([[q - d / 4, d, 0.0]]))

    def E(f):
        with mp.workdps(30):
            return mp.quad(lambda z: f(mp.sqrt(q - d / 4) * z) * mp.npdf(z), [-mp.inf, 0, mp.inf])
    d1 = lambda x: 1 / mp.cosh(x) ** 2                           # noqa: E731
    d3 = lambda x: -2 * d1(x) * (1 - 3 * mp.tanh(x) ** 2)        # noqa: E731  (tanh''' = -2 sech^2 (1 - 3 tanh^2))
    e2, e4 = E(lambda x: d1(x) ** 2), E(lambda x: d1(x) ** 4)
    assert float(F[0, 1] / d) == pytest.approx(float(e2), rel=1e-10)
    assert float(S[0, 1, 1] / d ** 2) == pytest.approx(float(3 * e4 - e2 ** 2), rel=1e-10)
    assert float(J[0, 1, 1]) == pytest.approx(float(e2), rel=1e-10)
    assert float(H[0, 1, 1, 1]) == pytest.approx(float(E(lambda x: d1(x) * d3(x)) / 2), rel=1e-10)
    dq = E(lambda x: x * 2 * mp.tanh(x) * d1(x)) / (2 * (q - d / 4))   # scale identity
    assert float(J[0, 0, 0]) == pytest.approx(float(dq), rel=1e-10)


def test_one_minus_c_and_its_derivatives_against_mpmath():
    Kr = np.array([[1.3, 2e-9, 0.0], [1.0, 0.5, 0.2], [0.4, 2.0, 0.1]])
    w, g, h = near.omega(Kr)
    with mp.workdps(50):
        for i, (xx, yy, xy) in enumerate(Kr):
            def om(a, b, c):
                aa, bb, ab = a + c + b / 4, a - c + b / 4, a - b / 4
                return 1 - ab / mp.sqrt(aa * bb)
            p = [mp.mpf(v) for v in (xx, yy, xy)]
            assert float(w[i]) == pytest.approx(float(om(*p)), rel=1e-14)
            for j in range(3):
                o = [int(j == k) for k in range(3)]
                assert float(g[i, j]) == pytest.approx(float(mp.diff(om, p, o)), rel=1e-10, abs=1e-14)


# ---------------------------------------------------------------- identical inputs, sigma_w2 = 0
@pytest.mark.parametrize("act", ["relu", "tanh"])
def test_identical_inputs_give_c_1_and_the_single_input_theory(act):
    """Old code: relu raised ZeroDivisionError, tanh gave gamma = -4.5e15 with status 0."""
    g = sf.gram_fluctuations(act, 2.0 if act == "relu" else 1.0, 0.0, 5, q0=(1.0, 1.0, 1.0))
    fw = sf.finite_width(act, 2.0 if act == "relu" else 1.0, 0.0, 5, 1.0)
    assert np.all(g.c == 1) and np.all(g.c_mean(N) == 1) and np.all(g.c_var(N) == 0)
    assert np.all(np.isinf(g.gamma)) and np.all(g.gamma > 0) and np.all(g.status == 3)
    assert np.all(np.isnan(g.gamma_var(N)))
    for i in range(3):
        np.testing.assert_allclose(g.K[:, i], fw.K, rtol=1e-14)
        np.testing.assert_allclose(g.K1[:, i], fw.K1, rtol=1e-12, atol=1e-15)
        for j in range(3):
            np.testing.assert_allclose(g.gram_cov[:, i, j], fw.V + 2 * fw.K ** 2, rtol=1e-12)


def test_sigma_w2_zero_is_a_deterministic_bias():
    g = sf.gram_fluctuations("tanh", 0.0, 0.5, 4, q0=(1.0, 2.0, 0.3))
    np.testing.assert_array_equal(g.K, 0.5)
    np.testing.assert_array_equal(g.metric_cov, 0.0)
    np.testing.assert_allclose(g.gram_cov, 2 * 0.25)           # Wishart of N(0, 1/2) nodes, identical inputs
    assert np.all(g.status == 3)
    with pytest.raises(ValueError, match="'sigma_b2' parameter of gram_fluctuations must be > 0 when sigma_w2 = 0"):
        sf.gram_fluctuations("tanh", 0.0, 0.0, 4)


# ---------------------------------------------------------------- bad input: one validator
@pytest.mark.parametrize("q0", [(-1.0, -1.0, 0.5), (-1.0, 1.0, 0.0), (0.0, 0.0, 0.0), (1.0, 1.0, float("nan")),
                                (1.0, 4.0, 2.5), -1.0])
def test_input_gram_validator_everywhere(q0):
    """Old code: (-1, -1, 0.5) ran with K_aa = -2 and status 0; (-1, 1, 0) raised "'mpc' object has no
    attribute '_mpf_'"."""
    with pytest.raises(ValueError, match=r"^The 'q0' parameter of gram_fluctuations must be \(qa, qb, qab\)"):
        sf.gram_fluctuations("relu", 2.0, 0.0, 3, q0=q0)
    with pytest.raises(ValueError, match="'q0' parameter of gram_fluctuations"):
        sf.gram_fluctuations("relu", 2.0, 0.0, 3, q0=q0, dps=20)
    one = q0 if np.ndim(q0) == 0 else q0[0]
    if not one > 0:
        for fn in (sf.finite_width, sf.width_gain):
            args = ("relu", 2.0, 0.0, 3) if fn is sf.finite_width else ("relu", 2.0, 0.0, 16, 3)
            with pytest.raises(ValueError, match=f"^The 'q0' parameter of {fn.__name__} must be a finite float > 0"):
                fn(*args, q0=one)


def test_tiny_and_huge_parameters_get_one_line():
    """Old code: ZeroDivisionError (no message) and '(34, Numerical result out of range)'."""
    for call in (lambda: sf.width_gain("tanh", 1e-300, 0.0, 32, 4), lambda: sf.gram_fluctuations("tanh", 1e-300, 0.0, 4),
                 lambda: sf.finite_width("relu", 1e-300, 0.0, 4)):
        with pytest.raises(ValueError, match="'sigma_w2' parameter of .* must be such that every layer variance "
                                             "stays a normal float64"):
            call()
    with pytest.raises(ValueError, match="'residual' parameter of gram_fluctuations must be alpha with 0 < alpha"):
        sf.gram_fluctuations("relu", 2.0, 0.0, 3, residual=1e300)
    for name in ("relu", "tanh"):     # K ~ 1e-300 is normal, K^2 is not: was a ZeroDivisionError
        with pytest.raises(ValueError, match="'q0' parameter of width_gain must be large enough that every squared"):
            sf.width_gain(name, 2.0, 0.0, 100, 4, q0=1e-300)


def test_cli_gram_near_c1_and_identical_inputs(capsys, tmp_path):
    from symfield.cli import main
    assert main(["gram", "relu", "--sigma-w2", "2", "--sigma-b2", "0", "--depth", "6", "--width", "100",
                 "--q0", "1,1,0.99999999", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert max(out["c_mean"]) <= 1 and set(out["status"]) == {0}
    assert out["K1_ab"][4] == pytest.approx(-1.0158e-15, rel=1e-3)      # dps=30 gives -1.0158013e-15
    nc = tmp_path / "g.nc"
    assert main(["gram", "relu", "--sigma-w2", "2", "--sigma-b2", "0", "--depth", "3", "--width", "100",
                 "--q0", "1,1,1", "-o", str(nc)]) == 4
    err = capsys.readouterr().err
    assert "status 3 (c_equals_one" in err and "gamma = inf" in err
    xr = pytest.importorskip("xarray")
    with xr.open_dataset(nc) as ds:
        assert ds.status.attrs["flag_meanings"] == "ok error_estimate_above_tolerance non_finite c_equals_one"
        np.testing.assert_array_equal(ds.status.attrs["flag_values"], [0, 1, 2, 3])
        assert np.all(np.isinf(ds.gamma.values)) and np.all(ds.one_minus_c.values == 0)


# ---------------------------------------------------------------- outputs
def test_finite_width_and_width_gain_to_xarray():
    pytest.importorskip("xarray")
    fw = sf.finite_width("relu", 2.0, 0.0, 4)
    ds = fw.to_xarray()
    np.testing.assert_array_equal(ds.V.values, [0, 20, 40, 60])
    assert ds.layer.values.tolist() == [1, 2, 3, 4] and ds.attrs["act"] == "relu"
    ex = sf.finite_width("relu", 2.0, 0.0, 3, exact=True).to_xarray()
    assert ex.V_mp.values[2].startswith("40.000000")
    wg = sf.width_gain("tanh", 1.0, 0.0, 32, 8)
    ds = wg.to_xarray()
    assert float(ds.sigma_w2) == wg.sigma_w2 and float(ds.expansion) == pytest.approx(wg.expansion)
    g = sf.gram_fluctuations("relu", 2.0, 0.0, 3, q0=(1.0, 1.0, 0.5)).to_xarray()
    assert g.status.attrs["flag_meanings"].split() == list(sf.GramFluctuations.STATUS_NAMES)


def test_width_gain_warns_where_the_1_over_n_expansion_fails():
    """Old code applied the correction at width 1 or 2 without a word. The expansion parameter is V/(n K^2)."""
    for n in (1, 2):
        with pytest.warns(ExpansionWarning, match=f"width {n} is too small"):
            wg = sf.width_gain("tanh", 1.0, 0.0, n, 4)
        assert wg.expansion > 0.2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wg = sf.width_gain("tanh", 1.0, 0.0, 32, 8)
    fw = sf.finite_width("tanh", 1.0, 0.0, 8)
    assert wg.expansion == pytest.approx(fw.V[-1] / (32 * fw.K[-1] ** 2), rel=1e-14)
