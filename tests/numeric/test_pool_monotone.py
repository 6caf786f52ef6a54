"""Max-pool maps of a monotone phi by order statistics (the h_k density of docs/theory.md section 4):
float64 quadrature, the per-c rule and the tables behind sf.C (symfield.numeric.pool.maxrule,
symfield.numeric.tables.fast_C), and dps=N.

Oracles, none of which calls symfield's h_k quadrature: (a) the exact linear max2 map
C = q12/2 + E|u||v|/2 (max = mean + |diff|/2); (b) relu max2 by Price + Plackett (below): dC = 2 P(u1 > 0,
v1 > 0, u1 > u2, v1 > v2) is a 4-D orthant probability whose c-derivative is elementary, so dC and
C = E[relu M_2]^2 sqrt(q1 q2) + int_0^q12 dC are 1-D mpmath.quad integrals; (c) exact values at
c = -1, 0, 1; (d) seeded Monte Carlo of the 2k-dimensional definition (k = 3, 8); (e) mpmath quadrature
of the 1-D density of M_k, and of the h_k density at dps 20 (written here, slow); (f) the
argmax-decomposition tensor oracle of tests/numeric/test_tables.py (another formula and other coordinates);
(g) the float64 evaluator, a second precision, and the q12-derivative of C (Price) at dps 30.
Symbolic kernels and identities: tests/numeric/test_pool_kernels.py.
"""
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.symbolic import gaussian as G
from symfield.numeric import quadrature as Q
from symfield.numeric import tables
from symfield.numeric.pool.maxrule import Rule
from conftest import TOL, tol_dps
from test_pool_kernels import PHI, POINTS, pool
from test_tables import max2_C_oracle

q1, q2, q12 = G.q1, G.q2, G.q12


# ---------------------------------------------------------------- float64: 1-D maps, h_k quadrature; (a), (e)
def mp_max1(f, k, qq, dps=30):
    with mp.workdps(dps):
        s = mp.sqrt(mp.mpf(qq))
        return mp.quad(lambda m: f(s * m) * k * mp.npdf(m) * mp.ncdf(m) ** (k - 1), [-mp.inf, 0, mp.inf])


@pytest.mark.parametrize("name,k", [("tanh", 2), ("tanh", 3), ("relu", 3), ("erf", 5)])
def test_one_dimensional_maps_vs_mpmath(name, k):
    act, phi = pool(name, "max", k), PHI[name][2]
    for qq in (1e-3, 1.0, 1e3):
        ref = mp_max1(lambda x: phi(x) ** 2, k, qq)
        assert abs(sf.V(act, qq) - ref) <= TOL["quad_float64"] * ref
        ref = mp_max1(phi, k, qq)
        assert abs(sf.map_value(act, "mean", qq) - ref) <= TOL["quad_float64"] * math.sqrt(sf.V(act, qq))


def test_one_dimensional_dps():
    act = pool("tanh", "max", 3)
    a = sf.map_value(act, "mean", 0.8, dps=25)
    ref = mp_max1(mp.tanh, 3, "0.8", dps=40)
    with mp.workdps(40):
        assert abs(a - ref) <= tol_dps(25) * abs(ref)


@pytest.mark.parametrize("a,b,c", POINTS + [(1e-3, 1e3, 0.3), (1e3, 1e3, 0.999999), (2.0, 0.5, -0.999999),
                                            (1.0, 1.0, -1.0), (1.0, 4.0, 1.0), (0.5, 2.0, 0.0)])
def test_h2_quadrature_vs_exact_linear_max2(a, b, c):
    """The float64 h_k quadrature (both terms) on phi = x, where the exact answer is known."""
    K = sf.kernel(pool("linear", "max", 2))
    v = c * math.sqrt(a * b)
    with mp.workdps(30):
        exact = K.C.subs({q1: sp.Float(a, 30), q2: sp.Float(b, 30), q12: sp.Float(repr(v), 30)}).evalf(30)
    got = Q.max_expect2(lambda x: x, lambda x: x, a, b, v, 2)
    assert abs(got - float(exact)) <= TOL["rule_float64"] * math.sqrt(a * b), (got, exact)
    d = Q.max_expect2(lambda x: 1.0 + 0 * x, lambda x: 1.0 + 0 * x, a, b, v, 2, argmax_only=True)
    assert abs(d - float(K.dC.subs({q1: a, q2: b, q12: v}))) <= TOL["rule_float64"]


def mp_max2(f, g, q1v, q2v, c, k=2, kinks=(), dps=20):
    """E[f(max u) g(max v)] from docs/theory.md's h_k at dps 20, written independently of symfield: coordinates
    t = c s + r z; unit panels, 12-point Gauss-Legendre; F(s, t) accumulated along each row by 6-point
    rules between consecutive nodes (dF/dt = n(t) N((s - c t)/r)).  ~2 minutes per value."""
    with mp.workdps(dps):
        q1v, q2v, c = mp.mpf(q1v), mp.mpf(q2v), mp.mpf(c)
        s1, s2, r = mp.sqrt(q1v), mp.sqrt(q2v), mp.sqrt(1 - c * c)
        L = 10
        gl = mp.calculus.quadrature.GaussLegendre(mp.mp)
        nodes, gap = gl.calc_nodes(3, mp.mp.prec), gl.calc_nodes(2, mp.mp.prec)

        def panels(pts):
            pts, out = sorted(set(pts)), []
            for a, b in zip(pts[:-1], pts[1:]):
                out += [(a + (b - a) / 2 * (1 + t), (b - a) / 2 * w) for t, w in nodes]
            return out

        def grid(a, b):
            n = int(mp.ceil(b - a))
            return [a + (b - a) * j / n for j in range(n + 1)]
        so = grid(-L, L) + [x / s1 for x in kinks]
        for x in kinks:
            so += [x / (s2 * c) + j * r / abs(c) for j in (-4, -2, -1, -0.5, 0, 0.5, 1, 2, 4)
                   if abs(x / (s2 * c) + j * r / abs(c)) < L]
        dF = lambda y, s: mp.npdf(y) * mp.ncdf((s - c * y) / r)
        total = 0
        for s, ws in panels(so):
            hi = max(L, min((L - c * s) / r, (r * s + L) / c if c > 0 else mp.inf))
            zp = grid(-L, hi) + [(x / s2 - c * s) / r for x in kinks if -L < (x / s2 - c * s) / r < hi]
            zp += [r * s / c] if -L < r * s / c < hi else []
            t0 = c * s - L * r
            F = mp.quad(lambda y: dF(y, s), [-L - 2, t0]) if t0 > -L - 2 else mp.mpf(0)
            prev, Gs = t0, 0
            for z, wz in panels(zp):
                t = c * s + r * z
                h = (t - prev) / 2
                F += h * mp.fsum(w * dF(prev + h * (1 + x), s) for x, w in gap)
                prev = t
                wt = k * F ** (k - 1) * mp.npdf(z) + k * (k - 1) * F ** (k - 2) * r * mp.npdf(t) * mp.ncdf(z) * mp.ncdf(r * s - c * z)
                Gs += wz * g(s2 * t) * wt
            total += ws * mp.npdf(s) * f(s1 * s) * Gs
        return total


@pytest.mark.slow
@pytest.mark.parametrize("name,point", [("relu", (1.0, 1.0, 0.99)), ("tanh", (0.7, 1.3, -0.5))])
def test_covariance_map_vs_mpmath_oracle(name, point):
    phi = PHI[name][2]
    a, b, c = point
    ref = mp_max2(phi, phi, a, b, c, kinks=(0,) if name == "relu" else ())
    got = sf.C(pool(name, "max", 2), a, b, c * math.sqrt(a * b))
    scale = math.sqrt(sf.V(pool(name, "max", 2), a) * sf.V(pool(name, "max", 2), b))
    assert abs(got - ref) <= TOL["quad_float64"] * scale


def test_scalar_C_of_a_built_table_runs_no_quadrature(monkeypatch):
    """Once relu+max2's theta-table exists, sf.C reads it: the engine's quadrature of C is never called
    (the speed of both paths is measured by `symfield bench`, not here)."""
    from symfield.numeric.maps import maps
    act = pool("relu", "max", 2)
    M = maps(sf.kernel(act))
    M.table.ensure()
    monkeypatch.setitem(M._direct, "C", lambda *a: pytest.fail("quadrature called for a tabulated point"))
    for c in (0.5, 0.99, -0.5):
        assert 0 < sf.C(act, 1.0, 2.0, c * math.sqrt(2.0)) < 2.0


# ---------------------------------------------------------------- float64: sf.C by the per-c rule and tables; (a), (c), (f)
RELU2 = sf.activation("relu", pool="max", k=2)
TANH2 = sf.activation("tanh", pool="max", k=2)
relu = lambda x: np.maximum(x, 0.0)


@pytest.mark.parametrize("a,b,c", [(1.0, 1.0, 0.5), (0.7, 1.3, -0.5), (2.0, 2.0, 0.99), (0.3, 3.0, 0.2),
                                   (1.0, 1.0, 0.999999), (1.0, 1.0, -0.999999), (0.01, 100.0, -0.99),
                                   (1.0, 1.0, 1.0), (1.0, 4.0, -1.0), (1.0, 4.0, 0.0)])
def test_rule_vs_exact_linear_max2(a, b, c):
    K = sf.kernel(sf.activation("linear", pool="max", k=2))
    v = c * math.sqrt(a * b)
    with mp.workdps(30):
        exact = float(K.C.subs({G.q1: sp.Float(a, 30), G.q2: sp.Float(b, 30), G.q12: sp.Float(repr(v), 30)}).evalf(30))
    got = Rule(c, 2, 100.0).expect(lambda x: x, lambda x: x, a, b)
    assert abs(got - exact) <= TOL["rounding"] * math.sqrt(a * b)
    assert abs(Rule(c, 2, 100.0).w.sum() - 1) <= TOL["rounding"]          # h_2 is a probability density


@pytest.mark.parametrize("q,c", [(1.0, -0.5), (1.0, 0.99), (0.4, 0.3), (2.0, -0.6), (1.2, 0.85)])
def test_rule_tanh_vs_argmax_oracle(q, c):
    V = float(sf.V(TANH2, q))
    got = float(Rule(c, 2, q).expect(np.tanh, np.tanh, q, q))
    assert abs(got - max2_C_oracle(np.tanh, q, c)) <= TOL["rounding"] * V


@pytest.mark.parametrize("q,c", [(100.0, -0.99), (65536.0, 0.99), (0.01, 0.5)])
def test_rule_converged_and_vs_max_expect2(q, c):
    """Where the tensor oracle is not resolved: two resolutions of the rule, and max_expect2."""
    V = float(sf.V(TANH2, q))
    a = float(Rule(c, 2, q).expect(np.tanh, np.tanh, q, q))
    b = float(Rule(c, 2, q, sub=2, n=14).expect(np.tanh, np.tanh, q, q))
    assert abs(a - b) <= TOL["rounding"] * V
    if q <= 100:
        assert abs(a - Q.max_expect2(np.tanh, np.tanh, q, q, c * q, 2)) <= TOL["rule_float64"] * V


def test_relu_max2_fast_C_all_norms():
    """Homogeneous table: C(q1, q2, q12) = sqrt(q1 q2) g(theta) for any norms; exact values at c = 0, +-1
    and max_expect2 elsewhere, in the natural scale sqrt(V(q1) V(q2)) = sqrt(q1 q2) (3/4 + 1/(2 pi))."""
    v1 = 3 / 4 + 1 / (2 * math.pi)
    for q1, q2 in [(1.0, 1.0), (0.01, 0.01), (100.0, 100.0), (0.3, 3.0), (100.0, 0.01)]:
        sq = math.sqrt(q1 * q2)
        for c, exact in [(1.0, v1), (0.0, (1 + math.sqrt(2)) ** 2 / (4 * math.pi)), (-1.0, 1 / math.pi)]:
            assert abs(sf.C(RELU2, q1, q2, c * sq) / sq - exact) <= TOL["table_float64"]
        for c in (0.99, 0.5, -0.5, -0.99):
            ref = Q.max_expect2(relu, relu, q1, q2, c * sq, 2, kinks=[0.0])
            assert abs(sf.C(RELU2, q1, q2, c * sq) - ref) <= 1e-11 * sq * v1


def test_tanh_max2_unequal_norms_falls_back_to_quadrature():
    a = sf.C(TANH2, 0.7, 1.3, -0.3)
    b = float(sf.C(TANH2, np.array(0.7), 1.3, -0.3))        # array input: the quadrature path
    assert a == b


@pytest.mark.slow
def test_tanh_max2_table_path_accuracy():
    """Equal norms: the panel of q in [1, 2) is built (~2 min) once repeated use pays for it
    (here: explicitly), then sf.C reads it; against the argmax oracle at the natural scale."""
    tables.table(TANH2, 1.0, 1.9)
    for q, c in [(1.0, 0.99), (1.3, -0.5), (1.7, 0.0), (1.9, 0.3)]:
        ref = max2_C_oracle(np.tanh, q, c)
        assert abs(sf.C(TANH2, q, q, c * q) - ref) <= TOL["quad_float64"] * float(sf.V(TANH2, q))


# ---------------------------------------------------------------- dps=N: mpmath versions of phi, phi'
def relu_mp(x):
    return x if x > 0 else mp.mpf(0)


def step_mp(x):
    return mp.mpf(1) if x > 0 else mp.mpf(0)


def sech2_mp(x):
    return 1 / mp.cosh(x) ** 2


def pair(a, b, c):
    """(q1, q2, q12) as mpf at 50 digits (q12 = c sqrt(q1 q2)) and c."""
    with mp.workdps(50):
        a, b, c = mp.mpf(str(a)), mp.mpf(str(b)), mp.mpf(str(c))
        return a, b, c * mp.sqrt(a * b), c


# ---------------------------------------------------------------- dps=N, (b) relu max2: Price + Plackett
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
    A = pool("relu", "max", 2)
    C = sf.C(A, a, b, q12, dps=20)
    dC = sf.map_value(A, "dC", a, b, q12, dps=20)
    with mp.workdps(40):
        G, dG = relu_max2_oracle(c)
        scale = mp.sqrt(a * b) * (mp.mpf(3) / 4 + 1 / (2 * mp.pi))     # sqrt(V(q1) V(q2))
        assert abs(C - mp.sqrt(a * b) * G) <= tol_dps(20) * scale
        assert abs(dC - dG) <= tol_dps(20) * mp.mpf(3) / 4  # dpsi2 = 3/4


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
        assert abs(v - dG) <= tol_dps(20) * 0.75
    else:
        v = Q.max_expect2(relu_mp, relu_mp, one, one, c, 2, kinks=[0], dps=20)
        assert abs(v - G) <= tol_dps(20) * 0.9


# ---------------------------------------------------------------- dps=N, (a) linear max2, exact
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
        assert abs(v - linear_exact(a, b, q12)) <= tol_dps(30) * mp.sqrt(a * b)


# ---------------------------------------------------------------- dps=N, (c) c = -1, 0, 1
def test_exact_special_cases():
    A3, A2 = pool("tanh", "max", 3), pool("relu", "max", 2)
    with mp.workdps(40):
        # c = 1: C = V, dC = dpsi2 (1-D maps); c = 0: C = mean^2, dC = mean(phi')^2 / k
        assert abs(sf.C(A3, 0.8, 0.8, 0.8, dps=20) - sf.V(A3, 0.8, dps=20)) <= tol_dps(20)
        assert abs(sf.map_value(A3, "dC", 0.8, 0.8, 0.8, dps=20) - sf.map_value(A3, "dpsi2", 0.8, dps=20)) \
            <= tol_dps(20)
        m1, m2 = sf.map_value(A3, "mean", 0.8, dps=20), sf.map_value(A3, "mean", 1.7, dps=20)
        assert abs(sf.C(A3, 0.8, 1.7, 0, dps=20) - m1 * m2) <= tol_dps(20)
        # relu, k = 2: dpsi2 = 3/4 exactly, so dC(c = 1) = 3/4; c = -1: one node is the max of u, the other of v,
        # C = E[u1+ (-u2)+ + u2+ (-u1)+] = 2 (E u+)^2 = sqrt(q1 q2)/pi; dC = 0
        assert abs(sf.map_value(A2, "dC", 2.0, 2.0, 2.0, dps=20) - mp.mpf(3) / 4) <= tol_dps(20)
        a, b, q12, _ = pair("0.25", "4", -1)        # q1 q2 = q12^2 exactly
        assert abs(sf.C(A2, a, b, q12, dps=20) - mp.sqrt(a * b) / mp.pi) <= tol_dps(20)
        assert sf.map_value(A2, "dC", a, b, q12, dps=20) == 0


# ---------------------------------------------------------------- dps=N, (d) Monte Carlo, 2k dimensions
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
    assert abs(float(C) - mc) <= TOL["mc_sigmas_strict"] * se, (float(C), mc, se)
    assert abs(float(dC) - md) <= TOL["mc_sigmas_strict"] * sd, (float(dC), md, sd)


# ---------------------------------------------------------------- dps=N, (g) float64, a second precision, Price
def natural(A, m, a, b):
    base = "V" if m == "C" else "dpsi2"
    return math.sqrt(sf.map_value(A, base, a) * sf.map_value(A, base, b))


@pytest.mark.parametrize("name,k,m,point", [("tanh", 2, "C", (1.0, 2.0, -0.5)), ("tanh", 3, "dC", (0.5, 1.0, 0.3)),
                                            pytest.param("relu", 4, "C", (0.3, 3.0, 0.9), marks=pytest.mark.slow),
                                            pytest.param("tanh", 2, "C", (10.0, 10.0, 0.5), marks=pytest.mark.slow),
                                            pytest.param("tanh", 2, "dC", (0.1, 10.0, -0.5), marks=pytest.mark.slow)])
def test_agrees_with_float64(name, k, m, point):
    A = pool(name, "max", k)
    a, b, c = point
    q12 = c * math.sqrt(a * b)
    hi = sf.map_value(A, m, a, b, q12, dps=20)
    assert abs(float(hi) - sf.map_value(A, m, a, b, q12)) <= TOL["rule_float64"] * natural(A, m, a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name,k,m", [("tanh", 2, "C"), ("tanh", 3, "dC"), ("relu", 3, "C")])
def test_two_precisions(name, k, m):
    A = pool(name, "max", k)
    a, b, q12, _ = pair(0.9, 1.4, "0.6")
    lo, hi = sf.map_value(A, m, a, b, q12, dps=20), sf.map_value(A, m, a, b, q12, dps=30)
    with mp.workdps(40):
        assert abs(lo - hi) <= tol_dps(20) * natural(A, m, 0.9, 1.4)


@pytest.mark.slow
def test_dC_is_the_q12_derivative_of_C_dps30():
    """Price: dC = dC/dq12; fourth-order central difference, h = 1e-5 (truncation ~h^4 ~ 1e-20)."""
    A = pool("tanh", "max", 3)
    a, b, q12, _ = pair(1.0, 1.0, "0.3")
    with mp.workdps(50):   # the shifted arguments exactly (at 15 digits their rounding alone moves C by 1e-18)
        h = mp.mpf("1e-5")
        qs = {j: q12 + j * h for j in (-2, -1, 1, 2)}
    Cs = {j: sf.C(A, a, b, qs[j], dps=30) for j in qs}
    with mp.workdps(40):
        num = (8 * (Cs[1] - Cs[-1]) - (Cs[2] - Cs[-2])) / (12 * h)
        assert abs(sf.map_value(A, "dC", a, b, q12, dps=30) - num) <= mp.mpf("1e-18")


# ---------------------------------------------------------------- dps=N: error control and cost
def test_unresolved_integrand_raises_arithmetic_error():
    """A jump at x = 0.3 not declared as a kink: the three-degree estimate stays large after two halvings."""
    g = lambda x: mp.mpf(1) if x > mp.mpf("0.3") else mp.mpf(0)
    with pytest.raises(ArithmeticError, match=r"max_expect2: quadrature error estimate .* exceeds the required .*dps=8"):
        Q.max_expect2(g, g, 1, 1, mp.mpf("0.5"), 2, dps=8)


def test_homogeneous_array_C_is_the_scalar_table_path_vectorised():
    """relu+max2 array sf.C: one NumPy pass over the theta-table, equal to the scalar table path point by
    point and to an independent argmax-decomposition quadrature (bench_cold.max2_C)."""
    from symfield.reports.bench_cold import max2_C
    act = sf.activation("relu", pool="max", k=2)
    rng = np.random.default_rng(3)
    n = 2000
    a, b = 10 ** rng.uniform(-3, 3, n), 10 ** rng.uniform(-3, 3, n)
    b[:60] = a[:60]
    c = rng.uniform(-1, 1, n) * np.sqrt(a * b)
    c[50:55], c[55:60] = a[50:55], -a[55:60]          # c = +1 and -1 at equal norms
    v = sf.C(act, a, b, c)
    scalar = np.array([sf.C(act, float(x), float(y), float(z)) for x, y, z in zip(a[:200], b[:200], c[:200])])
    np.testing.assert_allclose(v[:200], scalar, rtol=4e-15, atol=0)
    for i in (0, 300, 1000, 1999):
        assert abs(v[i] - max2_C(lambda t: np.maximum(t, 0), a[i], b[i], c[i], nodes=24)) <= 1e-13 * abs(v[i])
    # c = 1: C(q, q, q) = E[relu(max(u1, u2))^2] = q (3/4 + 1/(2 pi)) (half-moments of the maximum of two normals)
    np.testing.assert_allclose(v[50:55], a[50:55] * (0.75 + 1 / (2 * np.pi)), rtol=1e-14)
