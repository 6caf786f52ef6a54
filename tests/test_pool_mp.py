"""Max-pool covariance maps C and dC of a monotone phi at mpmath precision (dps=N).

Oracles, none of which calls symfield's h_k quadrature: (a) the exact linear max2 map
C = q12/2 + E|u||v|/2; (b) relu max2 by Price + Plackett (below): dC = 2 P(u1 > 0, v1 > 0,
u1 > u2, v1 > v2) is a 4-D orthant probability whose c-derivative is elementary, so dC and
C = E[relu M_2]^2 sqrt(q1 q2) + int_0^q12 dC are 1-D mpmath.quad integrals; (c) exact values at
c = -1, 0, 1; (d) seeded Monte Carlo of the 2k-dimensional definition (k = 3, 8); (e) the float64
evaluator (1e-12), a second precision, and the q12-derivative of C (Price) at dps 30.
"""
import math
import time

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from symfield.numeric import quadrature as Q

DIGITS = 19   # dps=20 results are compared at 10^-19 of the natural scale (TOL["dps_digits_slack"] = 1)


def relu_mp(x):
    return x if x > 0 else mp.mpf(0)


def step_mp(x):
    return mp.mpf(1) if x > 0 else mp.mpf(0)


def sech2_mp(x):
    return 1 / mp.cosh(x) ** 2


def act(name, k):
    return sf.activation(name, pool="max", k=k)


def pair(a, b, c):
    """(q1, q2, q12) as mpf at 50 digits (q12 = c sqrt(q1 q2)) and c."""
    with mp.workdps(50):
        a, b, c = mp.mpf(str(a)), mp.mpf(str(b)), mp.mpf(str(c))
        return a, b, c * mp.sqrt(a * b), c


# ---------------------------------------------------------------- (b) relu max2: Price + Plackett
def relu_max2_oracle(c):
    """(Gamma(c), Gamma'(c)), C = sqrt(q1 q2) Gamma(c), dC = Gamma'(c) for relu, k = 2.
    Gamma' = 2 P(X > 0), X = (u1, v1, (u1 - u2)/sqrt 2, (v1 - v2)/sqrt 2) with correlations linear in c;
    Plackett: dP/drho_ij = phi_2(0, 0; rho_ij) P(X_k > 0, X_l > 0 | X_i = X_j = 0) (a bivariate orthant,
    1/4 + asin(rho_kl|ij)/(2 pi)); P(0) = (3/8)^2; Gamma(0) = E[relu(M_2)]^2 = ((1 + sqrt 2)/(2 sqrt pi))^2."""
    s2 = mp.sqrt(2)

    def R(x):
        return mp.matrix([[1, x, 1 / s2, x / s2], [x, 1, x / s2, 1 / s2],
                          [1 / s2, x / s2, 1, x], [x / s2, 1 / s2, x, 1]])
    dR = {(0, 1): 1, (2, 3): 1, (0, 3): 1 / s2, (1, 2): 1 / s2}

    def dP(x):
        Rx, out = R(x), 0
        for (i, j), dr in dR.items():
            k, l = [m for m in range(4) if m not in (i, j)]
            S = mp.matrix([[Rx[i, i], Rx[i, j]], [Rx[j, i], Rx[j, j]]])
            X = mp.matrix([[Rx[k, i], Rx[k, j]], [Rx[l, i], Rx[l, j]]])
            K = mp.matrix([[Rx[k, k], Rx[k, l]], [Rx[l, k], Rx[l, l]]]) - X * mp.inverse(S) * X.T
            rho = K[0, 1] / mp.sqrt(K[0, 0] * K[1, 1])
            out += dr / (2 * mp.pi * mp.sqrt(1 - Rx[i, j] ** 2)) * (mp.mpf(1) / 4 + mp.asin(rho) / (2 * mp.pi))
        return out
    e = 1 - abs(c)   # split towards the (integrable) singularity at |c| = 1
    pts = [0] + [mp.sign(c) * (1 - mp.mpf(10) ** -j) for j in (2, 5, 10, 20) if mp.mpf(10) ** -j > e] + [c]
    P0 = mp.mpf(9) / 64
    A1 = (1 + s2) / (2 * mp.sqrt(mp.pi))
    P = P0 + mp.quad(dP, pts)
    G = A1 ** 2 + 2 * (c * P0 + mp.quad(lambda x: (c - x) * dP(x), pts))
    return G, 2 * P


def test_plackett_oracle_limits():
    """The oracle itself: c -> 1 gives V = 3/4 + 1/(2 pi) and dpsi2 = 3/4; c -> -1 gives 1/pi (exact, below) and 0."""
    with mp.workdps(25):
        G, dG = relu_max2_oracle(1 - mp.mpf(10) ** -22)
        assert abs(G - (mp.mpf(3) / 4 + 1 / (2 * mp.pi))) < 1e-20 and abs(dG - mp.mpf(3) / 4) < 1e-10
        G, dG = relu_max2_oracle(-1 + mp.mpf(10) ** -22)
        assert abs(G - 1 / mp.pi) < 1e-20 and abs(dG) < 1e-20


@pytest.mark.parametrize("point", [(0.7, 1.3, "0.5"), (0.7, 1.3, "-0.5"),
                                   pytest.param((2.0, 0.5, "0.99"), marks=pytest.mark.slow),
                                   pytest.param((0.1, 10.0, "-0.9"), marks=pytest.mark.slow)])
def test_relu_max2_C_and_dC_vs_plackett(point):
    a, b, q12, c = pair(*point)
    A = act("relu", 2)
    C = sf.C(A, a, b, q12, dps=20)
    dC = sf.map_value(A, "dC", a, b, q12, dps=20)
    with mp.workdps(40):
        G, dG = relu_max2_oracle(c)
        scale = mp.sqrt(a * b) * (mp.mpf(3) / 4 + 1 / (2 * mp.pi))     # sqrt(V(q1) V(q2))
        assert abs(C - mp.sqrt(a * b) * G) <= mp.mpf(10) ** -DIGITS * scale
        assert abs(dC - dG) <= mp.mpf(10) ** -DIGITS * mp.mpf(3) / 4  # dpsi2 = 3/4


@pytest.mark.parametrize("sign,m", [(1, "dC"), pytest.param(1, "C", marks=pytest.mark.slow),
                                    pytest.param(-1, "dC", marks=pytest.mark.slow), pytest.param(-1, "C", marks=pytest.mark.slow)])
def test_relu_max2_next_to_c_equals_pm_one(sign, m):
    """c = +-(1 - 2^-100) (exact in binary, so the input is not rounded): r = 1.8e-15."""
    with mp.workdps(32):
        c = sign * (1 - mp.mpf(2) ** -100)
        G, dG = relu_max2_oracle(c)
    one = mp.mpf(1)
    if m == "dC":
        v = Q.max_expect2(step_mp, step_mp, one, one, c, 2, kinks=[0], argmax_only=True, dps=20)
        assert abs(v - dG) <= mp.mpf(10) ** -DIGITS * 0.75
    else:
        v = Q.max_expect2(relu_mp, relu_mp, one, one, c, 2, kinks=[0], dps=20)
        assert abs(v - G) <= mp.mpf(10) ** -DIGITS * 0.9


# ---------------------------------------------------------------- (a) linear max2, exact
def linear_exact(a, b, q12):
    """E[max(u1, u2) max(v1, v2)] = q12/2 + E|u||v|/2, E|u||v| = (2/pi) sqrt(q1 q2) (sqrt(1 - c^2) + c asin c)."""
    c = q12 / mp.sqrt(a * b)
    return q12 / 2 + mp.sqrt(a * b) * (mp.sqrt(1 - c * c) + c * mp.asin(c)) / mp.pi


@pytest.mark.parametrize("point", [(1.0, 1.0, "0.3"),
                                   pytest.param((1.0, 2.0, "-0.5"), marks=pytest.mark.slow),
                                   pytest.param((0.1, 10.0, "0.99"), marks=pytest.mark.slow),
                                   pytest.param((3.0, 0.5, "-0.999999"), marks=pytest.mark.slow)])
def test_linear_max2_integral_path_vs_exact_dps30(point):
    """The kernel has this map in closed form, so the quadrature is called directly (f = g = x)."""
    a, b, q12, _ = pair(*point)
    v = Q.max_expect2(lambda x: x, lambda x: x, a, b, q12, 2, dps=30)
    with mp.workdps(50):
        assert abs(v - linear_exact(a, b, q12)) <= mp.mpf(10) ** -29 * mp.sqrt(a * b)


# ---------------------------------------------------------------- (c) c = -1, 0, 1
def test_exact_special_cases():
    A3, A2 = act("tanh", 3), act("relu", 2)
    with mp.workdps(40):
        # c = 1: C = V, dC = dpsi2 (1-D maps); c = 0: C = mean^2, dC = mean(phi')^2 / k
        assert abs(sf.C(A3, 0.8, 0.8, 0.8, dps=20) - sf.V(A3, 0.8, dps=20)) <= 1e-19
        assert abs(sf.map_value(A3, "dC", 0.8, 0.8, 0.8, dps=20) - sf.map_value(A3, "dpsi2", 0.8, dps=20)) <= 1e-19
        m1, m2 = sf.map_value(A3, "mean", 0.8, dps=20), sf.map_value(A3, "mean", 1.7, dps=20)
        assert abs(sf.C(A3, 0.8, 1.7, 0, dps=20) - m1 * m2) <= 1e-19
        # relu, k = 2: dpsi2 = 3/4 exactly, so dC(c = 1) = 3/4; c = -1: one node is the max of u, the other of v,
        # C = E[u1+ (-u2)+ + u2+ (-u1)+] = 2 (E u+)^2 = sqrt(q1 q2)/pi; dC = 0
        assert abs(sf.map_value(A2, "dC", 2.0, 2.0, 2.0, dps=20) - mp.mpf(3) / 4) <= 1e-19
        a, b, q12, _ = pair("0.25", "4", -1)        # q1 q2 = q12^2 exactly
        assert abs(sf.C(A2, a, b, q12, dps=20) - mp.sqrt(a * b) / mp.pi) <= 1e-19
        assert sf.map_value(A2, "dC", a, b, q12, dps=20) == 0


# ---------------------------------------------------------------- (d) Monte Carlo of the 2k-dimensional definition
def mc_max(phi, dphi, k, a, b, c, n=1_000_000, seed=0):
    """(C, se), (dC, se): psi = max_j phi(u_j); dC = E[phi'(u_A) phi'(v_B) [A = B]]."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2, k, n))
    u = math.sqrt(a) * z[0]
    v = math.sqrt(b) * (c * z[0] + math.sqrt(1 - c * c) * z[1])
    iu, iv = u.argmax(0), v.argmax(0)
    idx = np.arange(n)
    pc = phi(u[iu, idx]) * phi(v[iv, idx])
    pd = dphi(u[iu, idx]) * dphi(v[iv, idx]) * (iu == iv)
    return [(x.mean(), x.std() / math.sqrt(n)) for x in (pc, pd)]


MC = {"relu": (lambda x: np.maximum(x, 0), lambda x: (x > 0) * 1.0, relu_mp, step_mp, [0]),
      "tanh": (np.tanh, lambda x: 1 / np.cosh(x) ** 2, mp.tanh, sech2_mp, [])}


@pytest.mark.parametrize("name,k,point", [("relu", 3, (1.0, 1.5, 0.4)),
                                          pytest.param("tanh", 3, (0.5, 2.0, -0.6), marks=pytest.mark.slow),
                                          pytest.param("relu", 8, (1.0, 1.0, -0.5), marks=pytest.mark.slow),
                                          pytest.param("tanh", 8, (2.0, 1.0, 0.7), marks=pytest.mark.slow)])
def test_vs_monte_carlo_2k_dimensions(name, k, point):
    phi, dphi, fm, dm, kinks = MC[name]
    a, b, c = point
    (mc, se), (md, sd) = mc_max(phi, dphi, k, a, b, c, seed=k)
    q12 = c * math.sqrt(a * b)
    C = Q.max_expect2(fm, fm, a, b, q12, k, kinks=kinks, dps=20)
    dC = Q.max_expect2(dm, dm, a, b, q12, k, kinks=kinks, argmax_only=True, dps=20)
    assert abs(float(C) - mc) <= 5 * se, (float(C), mc, se)
    assert abs(float(dC) - md) <= 5 * sd, (float(dC), md, sd)


# ---------------------------------------------------------------- (e) float64, a second precision, Price
def natural(A, m, a, b):
    base = "V" if m == "C" else "dpsi2"
    return math.sqrt(sf.map_value(A, base, a) * sf.map_value(A, base, b))


@pytest.mark.parametrize("name,k,m,point", [("tanh", 2, "C", (1.0, 2.0, -0.5)), ("tanh", 3, "dC", (0.5, 1.0, 0.3)),
                                            pytest.param("relu", 4, "C", (0.3, 3.0, 0.9), marks=pytest.mark.slow),
                                            pytest.param("tanh", 2, "C", (10.0, 10.0, 0.5), marks=pytest.mark.slow),
                                            pytest.param("tanh", 2, "dC", (0.1, 10.0, -0.5), marks=pytest.mark.slow)])
def test_agrees_with_float64(name, k, m, point):
    A = act(name, k)
    a, b, c = point
    q12 = c * math.sqrt(a * b)
    hi = sf.map_value(A, m, a, b, q12, dps=20)
    assert abs(float(hi) - sf.map_value(A, m, a, b, q12)) <= 1e-12 * natural(A, m, a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name,k,m", [("tanh", 2, "C"), ("tanh", 3, "dC"), ("relu", 3, "C")])
def test_two_precisions(name, k, m):
    A = act(name, k)
    a, b, q12, _ = pair(0.9, 1.4, "0.6")
    lo, hi = sf.map_value(A, m, a, b, q12, dps=20), sf.map_value(A, m, a, b, q12, dps=30)
    with mp.workdps(40):
        assert abs(lo - hi) <= mp.mpf(10) ** -DIGITS * natural(A, m, 0.9, 1.4)


@pytest.mark.slow
def test_dC_is_the_q12_derivative_of_C_dps30():
    """Price: dC = dC/dq12; fourth-order central difference, h = 1e-5 (truncation ~h^4 ~ 1e-20)."""
    A = act("tanh", 3)
    a, b, q12, _ = pair(1.0, 1.0, "0.3")
    with mp.workdps(50):   # the shifted arguments exactly (at 15 digits their rounding alone moves C by 1e-18)
        h = mp.mpf("1e-5")
        qs = {j: q12 + j * h for j in (-2, -1, 1, 2)}
    Cs = {j: sf.C(A, a, b, qs[j], dps=30) for j in qs}
    with mp.workdps(40):
        num = (8 * (Cs[1] - Cs[-1]) - (Cs[2] - Cs[-2])) / (12 * h)
        assert abs(sf.map_value(A, "dC", a, b, q12, dps=30) - num) <= mp.mpf("1e-18")


# ---------------------------------------------------------------- error control and cost
def test_unresolved_integrand_raises_arithmetic_error():
    """A jump at x = 0.3 not declared as a kink: the three-degree estimate stays large after two halvings."""
    g = lambda x: mp.mpf(1) if x > mp.mpf("0.3") else mp.mpf(0)
    with pytest.raises(ArithmeticError, match=r"max_expect2: quadrature error estimate .* exceeds the required .*dps=8"):
        Q.max_expect2(g, g, 1, 1, mp.mpf("0.5"), 2, dps=8)


@pytest.mark.slow
@pytest.mark.parametrize("name,k,point,budget", [("relu", 2, (1.0, 1.0, 0.5), 10), ("tanh", 2, (1.0, 1.0, 0.5), 15),
                                                 ("tanh", 8, (1.0, 1.0, 0.5), 15), ("tanh", 2, (10.0, 10.0, -0.5), 60)])
def test_timing_dps20(name, k, point, budget):
    A = act(name, k)
    a, b, c = point
    t = time.perf_counter()
    sf.C(A, a, b, c * math.sqrt(a * b), dps=20)
    assert time.perf_counter() - t < budget
