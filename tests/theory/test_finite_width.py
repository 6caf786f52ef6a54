"""finite_width: the leading 1/n theory (K, V, K1) against exact identities, mpmath quadrature and
seeded Monte Carlo networks (symfield.simulate) at several widths.

Monte Carlo criterion (stated once): an estimate and its standard error come from the spread over
independent seed groups; a fitted 1/n coefficient must lie within MC_SIGMAS standard errors of the
theory, and must differ from zero by more than MC_SIGMAS standard errors where the theory says it is
non-zero (so the check has power).
"""
import mpmath
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.theory.finite_width import coefficients, finite_width, sigma_w2 as SW
from symfield.symbolic.gaussian import q as Q
from symfield.simulate import simulate

MC_SIGMAS = 3.5


# ---------------------------------------------------------------- exact identities
@pytest.mark.parametrize("sw", [2, 3, sp.Rational(1, 2)])
def test_relu_vertex_exact(sw):
    """ReLU, sigma_b2 = 0: <phi^2> = K/2, <phi^4> = 3K^2/2, so V' = (5/4) sw^2 K^2 + (sw/2)^2 V and K' = (sw/2) K:
    V/K^2 = 5 (l - 1) EXACTLY for every sigma_w2 (Rational arithmetic), and K1 = 0 (d^2<phi^2>/dK^2 = 0)."""
    fw = finite_width("relu", sw, 0, 12, exact=True)
    for l in range(1, 13):
        r = fw.V[l - 1] / fw.K[l - 1] ** 2
        assert isinstance(r, sp.Rational) and r == 5 * (l - 1)
        assert fw.K1[l - 1] == 0
        assert fw.K[l - 1] == sp.sympify(sw) * (sp.sympify(sw) / 2) ** (l - 1)
    co = coefficients("relu")
    assert sp.simplify(co.chi_par - SW / 2) == 0
    assert sp.simplify(co.V_source - sp.Rational(5, 4) * SW**2 * Q**2) == 0
    assert co.K1_source == 0 and co.closed_form


def test_relu_bias_exact_recursion():
    """sigma_b2 > 0 in exact mode: K is the variance map, V follows the linear recursion (hand-iterated here)."""
    fw = finite_width("relu", sp.Rational(3, 2), sp.Rational(1, 10), 5, exact=True)
    K, V = sp.Rational(3, 2) + sp.Rational(1, 10), sp.Integer(0)
    for l in range(1, 5):
        V = sp.Rational(9, 4) * sp.Rational(5, 4) * K**2 + sp.Rational(3, 4) ** 2 * V
        K = sp.Rational(3, 4) * K + sp.Rational(1, 10)
        assert fw.K[l] == K and fw.V[l] == V


def test_tanh_vertex_slope_two_thirds():
    """tanh at sigma_w2 = 1, sigma_b2 = 0: K ~ 1/(2l), <phi^4> - <phi^2>^2 ~ 2K^2, chi_par ~ 1 - 4K, so
    r = V/K^2 obeys r' = r + 2 - 2r/l + ...: r ~ (2/3) l. The slope r(l) - r(l-1) must approach 2/3 with an
    O(1/l) error (measured ~0.28/l), i.e. the error must halve when l doubles."""
    fw = finite_width("tanh", 1.0, 0.0, 1200)
    r = fw.V_over_K2
    err = {L: abs(r[L - 1] - r[L - 2] - 2 / 3) for L in (300, 600, 1200)}
    assert err[1200] < 5e-4
    assert err[600] < 0.6 * err[300] and err[1200] < 0.6 * err[600]
    assert abs(fw.K[-1] * 2 * 1200 - 1) < 0.02          # K ~ 1/(2l)


# ---------------------------------------------------------------- coefficients against mpmath quadrature
def _gauss(f, K):
    return mpmath.quad(lambda z: f(mpmath.sqrt(K) * z) * mpmath.npdf(z), [-mpmath.inf, 0, mpmath.inf])


def _ibp_oracle(phi_of):
    """K -> reference coefficients for phi = phi_of(t): <phi^2>, <phi^4> by mpmath quadrature, and the
    K-derivatives by Gaussian integration by parts, d<f>/dK = <f2>/2 and d^2<f>/dK^2 = <f4>/4 with f2, f4
    the 2nd and 4th derivatives of f = phi^2 (a different route from the package's scale identity)."""
    t = sp.Symbol("t", real=True)
    phi = phi_of(t)
    fs = [sp.lambdify(t, e, "mpmath") for e in (phi**2, phi**4, sp.diff(phi**2, t, 2), sp.diff(phi**2, t, 4))]

    def at(K):
        m2, m4, f2, f4 = (_gauss(f, K) for f in fs)
        return {"psi2": m2, "psi4": m4, "dpsi2": f2 / 2, "d2psi2": f4 / 4}
    return at


ORACLES = {
    "tanh": _ibp_oracle(sp.tanh),
    "erf": _ibp_oracle(sp.erf),
    "gelu": _ibp_oracle(lambda t: t * (1 + sp.erf(t / sp.sqrt(2))) / 2),
    "softplus": _ibp_oracle(lambda t: sp.log(1 + sp.exp(t))),
}


def _check(act, ref, K):
    from symfield.symbolic.activation import kinks
    from symfield.numeric.evaluate import evaluate
    co = coefficients(act)
    for name, val in ref.items():
        got = float(evaluate(getattr(co, name), (Q,), (K,), kinks(act.expr)))
        # natural scales: <psi^2>/K^j for its j-th K-derivative, <psi^4> for itself
        scale = abs(float(ref["psi4"])) if name == "psi4" else \
            abs(float(ref["psi2"])) / K ** {"psi2": 0, "dpsi2": 1, "d2psi2": 2}[name]
        assert abs(got - float(val)) <= 1e-9 * scale, (act.name, name, K, got, val)


@pytest.mark.parametrize("name, Ks", [("tanh", (0.3, 1.7)), ("erf", (0.3, 1.7)), ("softplus", (0.6,)),
                                      pytest.param("gelu", (0.6,), marks=pytest.mark.slow)])
def test_coefficients_against_mpmath(name, Ks):
    """<psi^2>, <psi^4>, d<psi^2>/dK, d^2<psi^2>/dK^2 (closed forms, or quadrature of the scale-identity
    integrals) against mpmath quadrature of the defining integrals and of the integration-by-parts forms."""
    act = sf.activation(name)
    with mpmath.workdps(20):
        for K in Ks:
            _check(act, ORACLES[name](K), K)


@pytest.mark.slow
def test_max_pool_coefficients_against_mpmath():
    """tanh+max2 (order-statistic integrals, derivatives by the scale identity) against mpmath quadrature over
    the density 2 n(m) N(m) of M_2, and mpmath.diff of that quadrature in K."""
    act = sf.activation("tanh", pool="max", k=2)

    def mom(j, K):
        return mpmath.quad(lambda m: mpmath.tanh(mpmath.sqrt(K) * m) ** j * 2 * mpmath.npdf(m) * mpmath.ncdf(m),
                           [-mpmath.inf, 0, mpmath.inf])
    K = 0.9
    with mpmath.workdps(15):
        ref = {"psi2": mom(2, K), "psi4": mom(4, K), "dpsi2": mpmath.diff(lambda k: mom(2, k), K),
               "d2psi2": mpmath.diff(lambda k: mom(2, k), K, 2)}
    _check(act, ref, K)


def test_max_pool_derivatives_by_differences():
    """Fast check of the scale-identity derivatives on order-statistic integrals (tanh+max2): central
    differences of the quadrature value of <psi^2> (h = 1e-3; truncation ~h^2) against d/dK and d^2/dK^2."""
    from symfield.symbolic.activation import kinks
    from symfield.numeric.evaluate import evaluate
    act = sf.activation("tanh", pool="max", k=2)
    co = coefficients(act)
    K, h = 0.9, 1e-3
    f = [float(evaluate(co.psi2, (Q,), (K + j * h,), kinks(act.expr))) for j in (-1, 0, 1)]
    d1 = float(evaluate(co.dpsi2, (Q,), (K,), kinks(act.expr)))
    d2 = float(evaluate(co.d2psi2, (Q,), (K,), kinks(act.expr)))
    assert abs((f[2] - f[0]) / (2 * h) - d1) < 1e-5 * abs(d1)
    assert abs((f[2] - 2 * f[1] + f[0]) / h**2 - d2) < 1e-3 * abs(d2)


def test_pool_moments_exact():
    """relu+avg2: <psi^4> from the raw moments of one node (the k nodes are independent):
    E[((a+b)/2)^4] = (1/16) sum_j C(4,j) E[relu^j] E[relu^(4-j)], E[relu^j] = K^(j/2) E[z^j; z>0] by mpmath;
    relu+max2: <psi^2> = (3/4 + 1/(2 pi)) K exactly (docs/theory.md section 4)."""
    from symfield.numeric.evaluate import evaluate
    co = coefficients(sf.activation("relu", pool="avg", k=2))
    K = 0.8
    with mpmath.workdps(25):
        raw = [mpmath.mpf(1)] + [mpmath.quad(lambda z: z**j * mpmath.npdf(z), [0, mpmath.inf])
                                 * mpmath.mpf(K) ** (mpmath.mpf(j) / 2) for j in range(1, 5)]  # relu^0 = 1
        ref4 = sum(mpmath.binomial(4, j) * raw[j] * raw[4 - j] for j in range(5)) / 16
        ref2 = sum(mpmath.binomial(2, j) * raw[j] * raw[2 - j] for j in range(3)) / 4
    assert abs(float(evaluate(co.psi4, (Q,), (K,))) - float(ref4)) < 1e-12 * float(ref4)
    assert abs(float(evaluate(co.psi2, (Q,), (K,))) - float(ref2)) < 1e-12 * float(ref2)
    assert co.closed_form
    cm = coefficients(sf.activation("relu", pool="max", k=2))
    assert sp.simplify(cm.psi2 - (sp.Rational(3, 4) + 1 / (2 * sp.pi)) * Q) == 0


def test_float_and_mpmath_modes_agree():
    a = finite_width("tanh", 1.3, 0.05, 3)
    b = finite_width("tanh", 1.3, 0.05, 3, dps=20)
    for name in ("K", "V", "K1"):
        x, y = getattr(a, name), np.array([float(v) for v in getattr(b, name)])
        assert np.allclose(x, y, rtol=1e-9, atol=1e-12 * np.max(np.abs(y))), name


def test_k1_from_edgeworth_equals_scale_mixture():
    """The K1 source (sigma_w2/2) V d^2<phi^2>/dK^2 equals the Edgeworth form (sigma_w2/8) V <(phi^2)''''>_K
    (fourth cumulant 3V/n of h): checked by mpmath for tanh at two K."""
    from symfield.numeric.evaluate import evaluate
    co = coefficients("tanh")
    t = sp.Symbol("t")
    f4 = sp.lambdify(t, sp.diff(sp.tanh(t) ** 2, t, 4), "mpmath")
    with mpmath.workdps(25):
        for K in (0.4, 2.0):
            edge = _gauss(f4, K) / 4               # <f''''>/4 = d^2<f>/dK^2
            got = float(evaluate(co.d2psi2, (Q,), (K,)))
            assert abs(got - float(edge)) < 1e-9 * max(1.0, abs(float(edge)))


# ---------------------------------------------------------------- Monte Carlo: the 1/n slope
def _fit_inverse_width(widths, means, ses):
    """Weighted least squares of n*y = a + b/n; returns (a, se_a)."""
    n = np.asarray(widths, float)
    y, s = np.asarray(means) * n, np.asarray(ses) * n
    A = np.stack([np.ones_like(n), 1 / n], axis=1) / s[:, None]
    cov = np.linalg.inv(A.T @ A)
    coef = cov @ A.T @ (y / s)
    return coef[0], np.sqrt(cov[0, 0])


def _kurtosis_slope(act, sw, sb, depth, widths, groups, nets, layer, seed0, stat="kurtosis"):
    means, ses = [], []
    for n in widths:
        vals = [getattr(simulate(act, n, depth, sw, sb, 1, n_networks=nets, seed=seed0 + 100 * n + g), stat)[layer - 1]
                for g in range(groups)]
        means.append(np.mean(vals))
        ses.append(np.std(vals, ddof=1) / np.sqrt(groups))
    return _fit_inverse_width(widths, means, ses)


@pytest.mark.parametrize("layer", [6])
def test_relu_critical_kurtosis_slope(layer):
    """ReLU at sigma_w2 = 2, sigma_b2 = 0: excess kurtosis of h^(l) = 3 V/(n K^2) + O(1/n^2) = 15 (l - 1)/n.
    Fit n * kurtosis = a + b/n over widths 100..800 (10 seed groups of 400 single-input networks each):
    a must match 15 (l - 1) within MC_SIGMAS standard errors and be > MC_SIGMAS se away from 0."""
    fw = finite_width("relu", 2.0, 0.0, layer, exact=True)
    theory = float(3 * fw.V[-1] / fw.K[-1] ** 2)
    assert theory == 15 * (layer - 1)
    a, se = _kurtosis_slope("relu", 2.0, 0.0, layer, [100, 200, 400, 800], 10, 400, layer, 1000)
    assert abs(a - theory) <= MC_SIGMAS * se, (a, se, theory)
    assert a > MC_SIGMAS * se


@pytest.mark.slow
def test_relu_critical_kurtosis_slope_precise():
    """The same at layer 10 with 4x the networks, for both the raw and the Rao-Blackwellised estimator."""
    theory = 15 * 9
    for stat in ("kurtosis", "kurtosis_cond"):
        a, se = _kurtosis_slope("relu", 2.0, 0.0, 10, [100, 200, 400, 800], 20, 800, 10, 5000, stat)
        assert abs(a - theory) <= MC_SIGMAS * se, (stat, a, se)
        assert se < 0.05 * theory


def test_pooled_vertex_kurtosis():
    """relu+max2 (sigma_w2 = 1.5, sigma_b2 = 0.1): the pooled vertex V = sigma_w2^2 k Var(psi^2) + chi_par^2 V
    predicts the kurtosis slope 3 V/K^2 at layer 5."""
    act = sf.activation("relu", pool="max", k=2)
    fw = finite_width(act, 1.5, 0.1, 5)
    theory = 3 * fw.V[-1] / fw.K[-1] ** 2
    a, se = _kurtosis_slope(act, 1.5, 0.1, 5, [100, 200, 400, 800], 8, 400, 5, 7000)
    assert abs(a - theory) <= MC_SIGMAS * se, (a, se, theory)
    assert a > MC_SIGMAS * se


def test_tanh_kernel_correction_k1():
    """tanh at sigma_w2 = 1, sigma_b2 = 0, layer 10: E[h^2] = K + K1/n with K1 = -0.107. The exact conditional
    second moment q_cond (unbiased for E h^2) over 8 inputs per network (orthogonal inputs stay uncorrelated
    for an odd phi at sigma_b2 = 0); fit n (E q_cond - K) = K1 + b/n over widths 25, 50, 100
    (10 seed groups of 100 networks per width)."""
    depth, layer = 10, 10
    fw = finite_width("tanh", 1.0, 0.0, depth)
    K, K1 = fw.K[layer - 1], fw.K1[layer - 1]
    widths, means, ses = [25, 50, 100], [], []
    for n in widths:
        vals = [simulate("tanh", n, depth, 1.0, 0.0, 8, n_networks=100, seed=300 + 10 * n + g).q_cond[layer - 1] - K
                for g in range(10)]
        means.append(np.mean(vals))
        ses.append(np.std(vals, ddof=1) / np.sqrt(10))
    a, se = _fit_inverse_width(widths, means, ses)
    assert abs(a - K1) <= MC_SIGMAS * se, (a, se, K1)
    assert abs(a) > MC_SIGMAS * se


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, exc, text", [
    (dict(sigma_w2=-1.0), ValueError, "'sigma_w2' parameter of finite_width must be a finite float >= 0"),
    (dict(depth=0), ValueError, "'depth' parameter of finite_width must be an integer >= 1"),
    (dict(q0=0.0), ValueError, "'q0' parameter of finite_width must be a finite float > 0"),
    (dict(sigma_b2=[0.1, 0.2]), TypeError, "'sigma_b2' parameter of finite_width must be a scalar"),
    (dict(exact="yes"), TypeError, "'exact' parameter of finite_width must be True or False"),
])
def test_bad_input(kwargs, exc, text):
    args = dict(act="relu", sigma_w2=2.0, sigma_b2=0.0, depth=3)
    args.update(kwargs)
    with pytest.raises(exc, match=text.replace("(", r"\(").replace(")", r"\)")):
        finite_width(**args)


def test_exact_needs_closed_form():
    with pytest.raises(NotImplementedError, match="closed-form"):
        finite_width("tanh", 1.0, 0.0, 3, exact=True)
