"""Gaussian moments of polynomials and tilted polynomials (the closed forms behind polynomial
activations), the oracles' tails for fast-growing integrands, and activations that jump."""
import math

import mpmath
import pytest
import sympy as sp

import symfield as sf
from symfield.reports.oracles import mp_expect1, mp_expect2
from symfield.symbolic import gaussian as g


def _mp_tilted2(m, a, n, b, q1, q2, q12):
    """E[u^m v^n exp(a u + b v)] by the nested Gauss-Legendre oracle written from the integrand alone."""
    return mp_expect2(lambda u: u ** m * mpmath.exp(a * u), lambda v: v ** n * mpmath.exp(b * v), q1, q2, q12, dps=30)


@pytest.mark.parametrize("m,a,n,b", [(3, 0, 5, 0), (4, 0.5, 2, -1), (0, 1, 3, 0.25), (6, 0, 6, 0)])
def test_tilted_bivariate_moments_match_quadrature(m, a, n, b):
    expr = g._mgf2(m, sp.nsimplify(a), n, sp.nsimplify(b))
    got = float(expr.subs({g.q1: sp.Rational(1, 2), g.q2: 2, g.q12: sp.Rational(-3, 5)}))
    ref = float(_mp_tilted2(m, a, n, b, 0.5, 2, -0.6))
    assert got == pytest.approx(ref, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("m,a", [(0, 0), (7, 0), (8, 0), (5, 1.5), (6, -0.5)])
def test_tilted_moments_match_quadrature(m, a):
    got = float(g._mgf1(m, sp.nsimplify(a)).subs(g.q, sp.Rational(3, 2)))
    with mpmath.workdps(30):
        s = mpmath.sqrt(mpmath.mpf(1.5))
        ref = mpmath.quad(lambda u: u ** m * mpmath.exp(a * u) * mpmath.npdf(u, 0, s), [-mpmath.inf, 0, mpmath.inf])
    assert got == pytest.approx(float(ref), rel=1e-12, abs=1e-14)


def test_high_degree_polynomial_kernel_is_exact():
    """x^24: V(q) = 47!! q^24 and C = E[u^24 v^24] (Isserlis), at a point, from the derived maps."""
    K = sf.kernel("x**24")
    assert sp.simplify(K.V - sp.factorial2(47) * g.q ** 24) == 0
    c = float(K.C.subs({g.q1: 1, g.q2: 1, g.q12: sp.Rational(1, 2)}))
    ref = sum(math.comb(24, k) ** 2 * math.factorial(k) * sp.factorial2(23 - k) ** 2 * 0.5 ** k
              for k in range(0, 25, 2))
    assert c == pytest.approx(float(ref), rel=1e-13)


def test_oracles_follow_a_far_tail():
    """x^128 has its mass near 11 sd: the 1-D oracle must grow its range (127!! q^64 exactly)."""
    got = mp_expect1(lambda t: t ** 128, mpmath.mpf("0.25"), dps=20)
    assert float(got / (sp.factorial2(127) * sp.Rational(1, 4) ** 64)) == pytest.approx(1, rel=1e-15)
    got2 = mp_expect2(lambda t: t ** 8, lambda t: t ** 8, 0.5, 2, -0.6)
    exact = float(g._centred_moment2(8, 8).subs({g.q1: sp.Rational(1, 2), g.q2: 2, g.q12: sp.Rational(-3, 5)}))
    assert float(got2) == pytest.approx(exact, rel=1e-13)


def test_jumping_activation_has_no_edge_of_chaos_and_verifies():
    with pytest.raises(ValueError, match="jumps"):
        sf.eoc("sign(x)", 0.1)
    rep = sf.verify("sign(x)")
    chi = [c for c in rep.checks if c.quantity.startswith("chi1")]
    assert chi and all(c.status == "pass" and c.package == math.inf for c in chi)
