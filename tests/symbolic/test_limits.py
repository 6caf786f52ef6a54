"""The q -> inf limit maps (symfield.symbolic.limits) and what the fixed-point modules decide from them.

Oracles: the limits of phi(x)/x worked by hand; the arc-cosine closed form of relu written here;
mpmath quadrature of the defining integrals at large q (tests/oracles.py) for the neutrality cutoff's
error bound."""
import math

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from symfield.symbolic.kernel import kernel
from symfield.symbolic.limits import limit_kernel, linear_growth
from symfield.theory import neutrality as fp


@pytest.mark.parametrize("act, ab", [("gelu", (0, 1)), ("silu", (0, 1)), ("softplus", (0, 1)), ("mish", (0, 1)),
                                     ("elu", (0, 1)), ("x*erf(x)", (-1, 1)), ("2*x + tanh(x)", (2, 2)),
                                     ("tanh", None), ("sigmoid", None), ("x**2", None)])
def test_linear_growth(act, ab):
    got = linear_growth(sf.activation(act).expr)
    assert (None if got is None else tuple(int(v) for v in got)) == ab


def test_limit_kernel_is_the_homogeneous_limit():
    LK = limit_kernel(kernel("gelu"))
    c = 0.3
    relu = (math.sqrt(1 - c * c) + (math.pi - math.acos(c)) * c) / (2 * math.pi)   # E[relu(u) relu(v)], q = 1
    assert float(sf.C(LK.act, 1.0, 1.0, c)) == pytest.approx(relu, rel=1e-14)
    assert limit_kernel(kernel("relu")) is None and limit_kernel(kernel("tanh")) is None
    pooled = limit_kernel(kernel(sf.activation("gelu", pool="max", k=2)))
    assert pooled.act.pool == "max" and pooled.act.k == 2


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_phase_at_infinite_q_star_uses_the_exact_limit(act):
    """q* = inf: c-map c -> C_inf(c)/V_inf (relu's, fixed point 1) and chi1 = sigma_w2 E[relu'^2] = sigma_w2/2
    exactly (formerly the maps at q = 1e8)."""
    p = sf.phase(act, 3.0, 0.1, full=True)
    assert p.q_star == math.inf and p.c_star == 1.0
    assert p.slope == 1.5 and p.label == "chaotic-deep-prejudice"


def test_neutral_cutoff_bound_holds_against_mpmath():
    """rho(q) = C(q, q, q/2)/V(q) from mpmath at q = cutoff and 16 cutoff lies within the bound
    e(q) = 2 R sqrt(V_inf/q) + R^2/q of the limit, and above 1/2 (so no neutrality root up there)."""
    from oracles import mp_expect1, mp_expect2
    K = kernel("gelu")
    Q = fp._neutral_cutoff(K)
    assert 1 <= Q < 2.0 ** 16
    LK = limit_kernel(K)
    R = fp._deviation(K, LK)
    assert 0.16 < R < 0.2          # sup |x Phi(x) - relu(x)| = 0.1700 (at x = -+0.7518)
    vi, ci = 0.5, (math.sqrt(0.75) + (math.pi - math.pi / 3) * 0.5) / (2 * math.pi)
    gelu = lambda t: t * mp.ncdf(t)
    for q in (Q, 16 * Q):
        v = mp_expect1(lambda t: gelu(t) ** 2, q, dps=15) / q
        c = mp_expect2(gelu, gelu, q, q, q / 2, dps=15) / q
        e = 2 * R * math.sqrt(vi / q) + R * R / q
        assert abs(float(v) - vi) <= e and abs(float(c) - ci) <= e
        assert float(c / v) > 0.5


def test_homogeneous_table_serves_every_q():
    """relu+max2 is homogeneous (C(q, q, cq) = q C(1, 1, c)): its table answers at q = 1e6, 1e10 too (it used to
    hand q >= 2^16 to the quadrature). Oracle: the float64 argmax decomposition at q = 1, times q."""
    from symfield.reports.bench_cold import max2_C
    from symfield.numeric.maps import maps
    M = maps(kernel(sf.activation("relu", pool="max", k=2)), method="table")
    q, c = np.array([1e6, 1e10]), np.array([0.3, -0.5])
    got = M.C_eq(q, c)
    for i in range(2):
        ref = q[i] * max2_C(lambda t: np.maximum(t, 0.0), 1.0, 1.0, c[i])
        assert abs(got[i] - ref) <= 1e-12 * q[i]
