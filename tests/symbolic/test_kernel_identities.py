"""Oracle (a): exact SymPy identities and the literature closed forms."""
import mpmath as mp
import pytest
import sympy as sp

import symfield as sf
from symfield.symbolic import gaussian as G
from symfield.symbolic.formula import X as x
from oracles import REGISTRY

q, q1, q2, q12 = G.q, G.q1, G.q2, G.q12
CLOSED = [n for n in REGISTRY if "V" in REGISTRY[n] and "C" in REGISTRY[n]]


@pytest.mark.parametrize("name", CLOSED)
def test_closed_form_found(name):
    assert sf.kernel(name).closed_form


@pytest.mark.parametrize("name", CLOSED + ["elu", "gelu", "tanh"])
def test_c_at_q_q_q_equals_v_exactly(name):
    K = sf.kernel(name)
    if not K.closed_form:
        assert K.C.subs({q1: q, q2: q, q12: q}).has(sp.Integral)
        return
    assert sp.simplify(K.C.subs({q1: q, q2: q, q12: q}) - K.V) == 0


@pytest.mark.parametrize("name", CLOSED)
def test_price_theorem_dC_is_dC_dq12(name):
    K = sf.kernel(name)
    diff = K.dC - sp.diff(K.C, q12)
    # exact where simplify can decide, else at a random interior point to 40 digits
    if sp.simplify(diff) != 0:
        val = diff.subs({q1: sp.Rational(7, 10), q2: sp.Rational(13, 10), q12: sp.Rational(-3, 10)}).evalf(40)
        assert abs(val) < 1e-35


def test_abrelu_general_formula_specialisations():
    a, b = sp.symbols("a b", real=True)
    general = G.expect2(a * sp.Min(x, 0) + b * sp.Max(x, 0), a * sp.Min(x, 0) + b * sp.Max(x, 0)).value
    S = sp.sqrt(q1 * q2 - q12**2)
    th = sp.atan2(S, q12)
    relu = sp.sqrt(q1 * q2) / (2 * sp.pi) * (S / sp.sqrt(q1 * q2) + (sp.pi - th) * q12 / sp.sqrt(q1 * q2))
    assert sp.simplify(general.subs({a: 0, b: 1}) - relu) == 0
    assert sp.simplify(general.subs({a: 1, b: 1}) - q12) == 0          # linear
    s = sp.Rational(1, 5)
    leaky = sp.simplify(sf.kernel("leaky_relu(0.2)").C)
    assert sp.simplify(general.subs({a: s, b: 1}) - leaky) == 0
    absval = 2 / sp.pi * (S + (sp.pi / 2 - th) * q12)
    assert sp.simplify(general.subs({a: -1, b: 1}) - absval) == 0
    # the specialisations the package builds from names are the same expressions
    assert sp.simplify(sf.kernel("relu").C - relu) == 0
    assert sp.simplify(sf.kernel("abs").C - absval) == 0


def test_erf_literature_forms():
    K = sf.kernel("erf")
    # V = (2/pi) asin(2q/(1+2q)): both sides of sin(pi V/2) = 2q/(1+2q) are positive, compare squares
    assert sp.simplify(sp.sin(K.V * sp.pi / 2) ** 2 - (2 * q / (1 + 2 * q)) ** 2) == 0
    assert sp.simplify(K.dpsi2 - 4 / (sp.pi * sp.sqrt(1 + 4 * q))) == 0
    lit = 2 / sp.pi * sp.asin(2 * q12 / sp.sqrt((1 + 2 * q1) * (1 + 2 * q2)))
    for pt in [("0.3", "2", "0.7"), ("0.001", "1000", "-0.9"), ("5", "5", "4.99999")]:
        sub = dict(zip((q1, q2, q12), map(sp.Rational, pt)))
        assert abs(sp.N(K.C.subs(sub) - lit.subs(sub), 40)) < 1e-30


def test_polynomial_moments_isserlis():
    assert sp.expand(sf.kernel("monomial(2)").C - (q1 * q2 + 2 * q12**2)) == 0
    assert sp.expand(sf.kernel("monomial(3)").C - (9 * q1 * q2 * q12 + 6 * q12**3)) == 0
    assert sp.expand(sf.kernel("monomial(4)").C - (9 * q1**2 * q2**2 + 72 * q1 * q2 * q12**2 + 24 * q12**4)) == 0
    assert sf.kernel("monomial(5)").V == 945 * q**5
    assert sf.kernel("monomial(2)").mean == q


def test_trig_closed_forms():
    K = sf.kernel("sin")
    assert sp.simplify((K.C - sp.exp(-(q1 + q2) / 2) * sp.sinh(q12)).rewrite(sp.exp)) == 0
    assert sp.simplify((sf.kernel("cos").C - sp.exp(-(q1 + q2) / 2) * sp.cosh(q12)).rewrite(sp.exp)) == 0


def test_dV_is_gaussian_integration_by_parts():
    """dV = E[phi'^2 + phi phi''] = dV/dq; compare with mpmath quadrature of the right-hand side."""
    for name, d2 in [("erf", lambda t: -4 * t * mp.exp(-t * t) / mp.sqrt(mp.pi)), ("sin", lambda t: -mp.sin(t))]:
        K = sf.kernel(name)
        ent = REGISTRY[name]
        from oracles import mp_expect1
        for qq in ("0.1", "2"):
            ref = mp_expect1(lambda t: ent["dphi"](t) ** 2 + ent["phi"](t) * d2(t), qq, dps=30)
            with mp.workdps(30):
                assert abs(mp.mpf(str(sp.N(K.dV.subs(q, sp.Rational(qq)), 35))) - ref) < 1e-25


def test_no_closed_form_is_declared():
    for name in ("tanh", "sigmoid", "softplus", "silu", "mish"):
        K = sf.kernel(name)
        assert not K.closed_form and K.methods["C"] == "integral" and K.C.has(sp.Integral)


def test_gelu_and_xerf_one_dimensional_maps_by_stein_reduction():
    """E[gelu] = q/sqrt(2 pi (1+q)) and E[x erf x] = 2q/sqrt(pi (1+2q)), derived, not integrated."""
    for name in ("gelu", "x*erf(x)"):
        K = sf.kernel(name)
        assert {K.methods[m] for m in ("V", "mean", "dpsi2")} == {"stein"} and not K.closed_form
        for qq in ("0.01", "1", "100"):
            with mp.workdps(30):
                ref = REGISTRY[name]["mean"](mp.mpf(qq))
                assert abs(mp.mpf(str(sp.N(K.mean.subs(q, sp.Rational(qq)), 35))) - ref) < 1e-25


def test_sympy_integrate_step(monkeypatch):
    """An integrand outside the tables (relu times a Gaussian bump) goes to sympy.integrate."""
    monkeypatch.setattr(G, "INTEGRATE_SECONDS", 600)   # a guard only: about 35 s on an idle 2-core machine
    e = G.expect1(sp.Max(x, 0) * sp.exp(-x**2))
    assert e.method == "integrate"
    ref = q / (sp.sqrt(2 * sp.pi * q) * (2 * q + 1))     # E[x e^(-x^2); x > 0], x ~ N(0, q)
    for qq in (sp.Rational(1, 10), 3):
        assert abs(sp.N((e.value - ref).subs(q, qq), 30)) < 1e-25


def test_kernel_is_cached():
    assert sf.kernel("tanh") is sf.kernel("tanh")


def test_kernel_keeps_the_activation_name():
    assert sf.kernel("log(1+exp(x))").act.name == "log(1+exp(x))"
    assert sf.activation("x+1", pool="avg", k=2).single.name == "x+1"
    assert sf.kernel(sf.activation("tanh", pool="max", k=2)).act.name == "tanh+max2"
