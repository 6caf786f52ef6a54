"""The typed integrals are SymPy integrals (issue 27): N/evalf/float, lambdify ("mpmath", "numpy"),
latex and srepr treat a GaussianIntegral as the Integral it is.

Oracles: the defining integrals computed here by mpmath without the package -- E[tanh(sqrt(q) M_k)]
against the density k n(m) Phi(m)^(k-1) of the maximum of k standard normals (mpmath.quad), the
bivariate E[tanh(u) tanh(v)] and E[elu(u) elu(v)] by tensor Gauss-Legendre on [-12, 12]^2 (the inner
rule split at the kink) -- and the reference values of issue 27 for pooled tanh.
"""
import mpmath
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.reports.derive import tex
from symfield.symbolic import gaussian as G
from symfield.symbolic.integrals import GaussianIntegral, integrals

REFERENCE = {2: "0.3618567571740698513772149", 3: "0.5427851357611047770658224"}   # issue 27


def _pooled_mean(k):
    K = sf.kernel(sf.activation("tanh", pool="max", k=k))
    assert integrals(K.mean), "E[psi] of pooled tanh keeps its defining integral"
    return K.mean


def _mp_max_mean(k, dps):
    """E[tanh(M_k)] = int tanh(m) k n(m) Phi(m)^(k-1) dm by mpmath.quad, independently of symfield."""
    with mpmath.workdps(dps):
        f = lambda m: mpmath.tanh(m) * k * mpmath.npdf(m) * mpmath.ncdf(m) ** (k - 1)
        return +mpmath.quad(f, [-mpmath.inf, 0, mpmath.inf])


@pytest.mark.parametrize("k", [2, 3])
def test_reference_values_are_the_defining_integral(k):
    with mpmath.workdps(30):
        assert abs(_mp_max_mean(k, 40) - mpmath.mpf(REFERENCE[k])) < mpmath.mpf(10) ** -25


@pytest.mark.parametrize("k", [2, 3])
def test_N_and_float_of_pooled_tanh_mean(k):
    E = _pooled_mean(k).subs(G.q, 1)
    v = sp.N(E, 25)
    assert v.is_Float, v
    with mpmath.workdps(30):
        assert abs(mpmath.mpf(str(v)) - mpmath.mpf(REFERENCE[k])) <= mpmath.mpf(10) ** -24
    assert str(v) == REFERENCE[k]
    assert float(E) == pytest.approx(float(REFERENCE[k]), rel=1e-15, abs=0)
    assert E.evalf(20) == sp.N(E, 20)
    # evalf(subs=...) on the expression in q, and a sum holding the integral
    assert float((_pooled_mean(k) + 1).evalf(20, subs={G.q: 1})) == pytest.approx(1 + float(REFERENCE[k]), rel=1e-15)


@pytest.mark.parametrize("k", [2, 3])
def test_lambdify_mpmath_at_25_digits(k):
    fn = sp.lambdify(G.q, _pooled_mean(k), modules="mpmath")
    with mpmath.workdps(25):
        v = fn(1)
        assert isinstance(v, mpmath.mpf)
        want = mpmath.mpf(REFERENCE[k])
    with mpmath.workdps(30):
        assert abs(v - want) <= mpmath.mpf(10) ** -24 * abs(want)
        other = _mp_max_mean(k, 30)
    with mpmath.workdps(25):   # another q, against the oracle with the scale put into tanh
        got = fn(mpmath.mpf("2.5"))
    with mpmath.workdps(35):
        f = lambda m: mpmath.tanh(mpmath.sqrt(mpmath.mpf("2.5")) * m) * k * mpmath.npdf(m) * mpmath.ncdf(m) ** (k - 1)
        ref = mpmath.quad(f, [-mpmath.inf, 0, mpmath.inf])
        assert abs(got - ref) <= mpmath.mpf(10) ** -24 * abs(ref)
    assert other == pytest.approx(float(REFERENCE[k]), rel=1e-15)


@pytest.mark.parametrize("k", [2, 3])
def test_lambdify_numpy_to_1e_12(k):
    fn = sp.lambdify(G.q, _pooled_mean(k), modules="numpy")
    assert abs(fn(1.0) - float(REFERENCE[k])) <= 1e-12
    qs = np.array([0.5, 1.0, 4.0])
    got = fn(qs)
    assert got.shape == (3,)
    for qv, g in zip(qs, got):
        f = lambda m: mpmath.tanh(mpmath.sqrt(qv) * m) * k * mpmath.npdf(m) * mpmath.ncdf(m) ** (k - 1)
        assert abs(g - float(mpmath.quad(f, [-mpmath.inf, 0, mpmath.inf]))) <= 1e-12


def _gl_rule(points, degree):
    """Composite Gauss-Legendre nodes and weights (mpmath) on the panels between sorted points."""
    rule = mpmath.calculus.quadrature.GaussLegendre(mpmath.mp).calc_nodes(degree, mpmath.mp.prec)
    out = []
    for a, b in zip(points[:-1], points[1:]):
        h, mid = (b - a) / 2, (a + b) / 2
        out += [(mid + h * t, h * w) for t, w in rule]
    return out


def _mp_pair(f, g, c, dps, inner_kink=None, width=3, degree=5):
    """E[f(z1) g(c z1 + s z2)], s = sqrt(1 - c^2), by tensor Gauss-Legendre on [-12, 12]^2 (panels of
    `width`; the inner rule also split where c z1 + s z2 = inner_kink)."""
    with mpmath.workdps(dps):
        c = mpmath.mpf(c)
        s = mpmath.sqrt(1 - c * c)
        grid = [mpmath.mpf(j) for j in range(-12, 13, width)]
        plain = [(z, w * mpmath.npdf(z)) for z, w in _gl_rule(grid, degree)]
        total = 0
        for a, wa in _gl_rule(grid, degree):
            rule = plain
            if inner_kink is not None and -12 < (inner_kink - c * a) / s < 12:
                pts = sorted(set(grid) | {(inner_kink - c * a) / s})
                rule = [(z, w * mpmath.npdf(z)) for z, w in _gl_rule(pts, degree)]
            total += wa * mpmath.npdf(a) * f(a) * mpmath.fsum(w * g(c * a + s * z) for z, w in rule)
        return +total


def test_evalf_of_the_2d_covariance_integral_of_tanh():
    K = sf.kernel("tanh")
    (I,) = integrals(K.C)
    assert len(I.limits) == 2
    E = K.C.subs({G.q1: 1, G.q2: 1, G.q12: sp.Rational(1, 2)})
    ref = _mp_pair(mpmath.tanh, mpmath.tanh, "0.5", 25)
    with mpmath.workdps(25):   # converged: another panel width agrees
        assert abs(_mp_pair(mpmath.tanh, mpmath.tanh, "0.5", 25, width=4) - ref) < mpmath.mpf(10) ** -21
    v = sp.N(E, 20)
    assert v.is_Float
    with mpmath.workdps(25):
        assert abs(mpmath.mpf(str(v)) - ref) <= mpmath.mpf(10) ** -19 * abs(ref)
    assert float(E) == pytest.approx(float(ref), rel=2e-16)
    fnp = sp.lambdify((G.q1, G.q2, G.q12), K.C, modules="numpy")
    assert abs(fnp(1.0, 1.0, 0.5) - float(ref)) <= 1e-12
    assert fnp(np.array([1.0, 1.0]), 1.0, np.array([0.5, 0.5])) == pytest.approx([float(ref)] * 2, abs=1e-12)


@pytest.mark.slow
def test_evalf_of_a_2d_integral_with_a_kink_and_pieces():
    """elu's C: the product of two Piecewise is folded into one, so the integral is evaluated as nested
    1-D rules with the inner kink c z1 + s z2 = 0 as a function of z1."""
    K = sf.kernel("elu")
    (I,) = integrals(K.C)
    E = K.C.subs({G.q1: 1, G.q2: 1, G.q12: sp.Rational(-3, 10)})
    elu = lambda t: t if t > 0 else mpmath.expm1(t)
    ref = _mp_pair(elu, elu, "-0.3", 12, inner_kink=0)
    v = sp.N(E, 6)
    assert v.is_Float
    assert float(v) == pytest.approx(float(ref), rel=1e-6)
    fnp = sp.lambdify((G.q1, G.q2, G.q12), K.C, modules="numpy")
    assert fnp(1.0, 1.0, -0.3) == pytest.approx(float(ref), rel=1e-11)


def test_kinked_1d_integral_splits_at_the_kink():
    K = sf.kernel(sf.activation("tanh(relu(x))", pool="max", k=2))
    E = K.mean.subs(G.q, 2)
    with mpmath.workdps(30):
        f = lambda m: mpmath.tanh(mpmath.sqrt(2) * m) * 2 * mpmath.npdf(m) * mpmath.ncdf(m)
        ref = mpmath.quad(f, [0, mpmath.inf])
        assert abs(mpmath.mpf(str(sp.N(E, 20))) - ref) <= mpmath.mpf(10) ** -19 * ref


def test_what_cannot_be_evaluated_stays_unevaluated():
    """Free symbols, or an undefined density (h_2 of the max-pool covariance): N leaves the integral, float
    says it cannot convert the expression (not 'complex')."""
    K = sf.kernel(sf.activation("tanh", pool="max", k=2))
    assert sp.N(K.mean, 15).has(sp.Integral)
    C = K.C.subs({G.q1: 1, G.q2: 1, G.q12: sp.Rational(1, 2)})
    assert sp.N(C, 15).has(sp.Integral)
    with pytest.raises(TypeError, match="Cannot convert expression to float"):
        float(C)


def _all_kinds():
    out = []
    for act in ("tanh", sf.activation("tanh", pool="max", k=2), sf.activation("sin", pool="max", k=2)):
        K = sf.kernel(act)
        out += [I for name in ("V", "C", "mean", "dpsi2", "dC", "dV") for I in integrals(K[name])]
    return out


def test_srepr_round_trips_every_kind():
    ns = {}
    exec("from sympy import *", ns)
    ns["GaussianIntegral"] = GaussianIntegral
    kinds = set()
    for I in _all_kinds():
        back = eval(sp.srepr(I), ns)
        assert isinstance(back, GaussianIntegral) and back == I and back.integrand == I.integrand
        kinds.add(I.integrand.kind)
    assert len(kinds) >= 5, kinds


def test_latex_is_that_of_the_plain_integral_in_sympy_and_in_derive():
    for I in _all_kinds()[:6]:
        plain = sp.Integral(*I.args)
        assert sp.latex(I) == sp.latex(plain)
        assert tex(I) == tex(plain)
        # inside a power, product or quotient it binds like an Integral: E[psi]^2 is (int Dz psi)^2, never
        # int Dz psi^2 (softplus's gamma^(2) document had V - E[psi]^2 printed as 0 this way)
        x = sp.Symbol("x")
        for e, p in ((I ** 2, plain ** 2), (x * I, x * plain), (I / (1 + I ** 2), plain / (1 + plain ** 2))):
            assert sp.latex(e) == sp.latex(p) and tex(e) == tex(p) and sp.pretty(e) == sp.pretty(p)
