"""The large-q split of the variance map (symfield.numeric.remainder) against 40-digit mpmath quadrature of the
defining integral, and the fixed points it decides where sigma_w2 V_L(1) = 1 (He for softplus)."""
import math

import mpmath
import numpy as np
import pytest

import symfield as sf
from symfield.numeric.remainder import remainder
from symfield.symbolic.kernel import kernel

PHIS = {  # name: (phi in mpmath, phi_L)
    "softplus": (lambda t: mpmath.log1p(mpmath.exp(t)), lambda t: max(t, 0)),
    "gelu": (lambda t: t * mpmath.ncdf(t), lambda t: max(t, 0)),
    "x*erf(x)": (lambda t: t * mpmath.erf(t), lambda t: abs(t)),
}


def _r_mpmath(phi, phiL, q):
    """E[phi^2 - phi_L^2], x ~ N(0, q), by mpmath.quad of the difference (the window where it lives)."""
    with mpmath.workdps(40):
        s = mpmath.sqrt(q)
        f = lambda t: (phi(t) ** 2 - phiL(t) ** 2) * mpmath.npdf(t, 0, s)
        return float(mpmath.quad(f, [-80, -20, -5, 0, 5, 20, 80]))


@pytest.mark.parametrize("name", sorted(PHIS))
@pytest.mark.parametrize("q", [1e4, 3e4, 1e5, 1e7, 1e11])
def test_remainder_matches_mpmath(name, q):
    rem = remainder(kernel(name))
    want = _r_mpmath(*PHIS[name], q)
    assert abs(float(rem(q)) - want) <= 1e-12 * abs(want)


@pytest.mark.parametrize("name", sorted(PHIS))
def test_series_in_one_over_q_matches_the_node_sum(name):
    """From q_series up R is a 1/q series of the nodes' moments (its truncation bound below 1e-17 sum|w d|)."""
    rem = remainder(kernel(name))
    q = np.geomspace(rem.q_series, 1e14, 40)
    nodes = (np.exp(-rem.x2[None, :] / (2 * q[:, None])) / np.sqrt(2 * math.pi * q[:, None])) @ rem.wd
    scale = np.abs(rem.wd).sum() / np.sqrt(2 * math.pi * q)
    assert np.all(np.abs(rem(q) - nodes) <= 4e-15 * scale)


def test_he_softplus_has_no_finite_fixed_point():
    """2 V(q) - q = 2 R(q) > 0 at every q (softplus > relu pointwise): q* = inf, the relu limit map decides the phase."""
    for q in (1e4, 1e8, 1e12):
        assert _r_mpmath(*PHIS["softplus"], q) > 0
    assert sf.q_star("softplus", 2.0, 0.0) == math.inf
    assert sf.q_star("log(1+exp(x))", 2.0, 0.0) == math.inf
    assert sf.fixed_points("softplus", 2.0, 0.0).roots == ()
    p = sf.phase("log(1+exp(x))", 2.0, 0.0, full=True)
    assert p.label == "edge-of-chaos" and p.q_star == math.inf and p.c_star == 1.0 and p.slope == 1.0


def test_no_split_where_phi_minus_limit_does_not_decay():
    """elu - relu -> -1 as x -> -inf: the window rule does not apply and the kernel keeps the plain g."""
    assert remainder(kernel("elu")) is None and remainder(kernel("tanh")) is None and remainder(kernel("relu")) is None
