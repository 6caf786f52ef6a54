"""The large-q tail (symfield/numeric/tail.py) against mpmath quadrature of the defining integrals.

The oracle is written here from phi and the homogeneous part h (stated per activation below, not taken from
the code): V = int phi^2 p_q; C = E_v[phi(v) m(v)] + E_u[l(u) m(u)] + E[l(u) l(v)] with m(v) = E[h(u) | v] in
closed form (Phi and phi of c v / s), l = phi - h, the last term by a tensor Gauss-Legendre rule on
[-X, X]^2 (node values of l from mpmath); D = 2 V - 2 C at 40 digits (theta from d).
"""
import math

import mpmath
import numpy as np
import pytest

import symfield as sf
from symfield.numeric.maps import maps
from symfield.numeric.tail import tail

# (a, b, A, B): h(x) = a min(x, 0) + b max(x, 0) + A H(-x) + B H(x)
H = {"gelu": (0, 1, 0, 0), "silu": (0, 1, 0, 0), "softplus": (0, 1, 0, 0), "elu": (0, 1, -1, 0),
     "tanh": (0, 0, -1, 1), "sigmoid": (0, 0, 0, 1), "mish": (0, 1, 0, 0)}
PHI = {"gelu": lambda x: x * mpmath.ncdf(x), "silu": lambda x: x / (1 + mpmath.exp(-x)),
       "softplus": lambda x: mpmath.log1p(mpmath.exp(x)) if x < 0 else x + mpmath.log1p(mpmath.exp(-x)),
       "elu": lambda x: x if x > 0 else mpmath.expm1(x), "tanh": mpmath.tanh,
       "sigmoid": lambda x: 1 / (1 + mpmath.exp(-x)), "mish": lambda x: x * mpmath.tanh(mpmath.log1p(mpmath.exp(x)))}
XL = {"gelu": 10, "tanh": 24}        # l is below 1e-20 beyond +-XL (40 for the others)
DPS = 30


def _h(name, x):
    a, b, A, B = H[name]
    return a * x + A if x < 0 else b * x + B


def _l(name, x):
    return PHI[name](x) - _h(name, x)


def _quad(f, q, X, s=None):
    """int f(x) p_q(x) dx on panels: every sd of q (and of s) to 14 sd, every unit on [-X, X]."""
    sd = mpmath.sqrt(q)
    pts = {mpmath.mpf(j) * sd for j in range(-14, 15)} | {mpmath.mpf(j) for j in range(-X, X + 1)}
    if s is not None:
        pts |= {mpmath.mpf(j) * s for j in range(-14, 15)}
    pts = sorted(p for p in pts if abs(p) <= 14 * sd)
    return mpmath.quad(lambda x: f(x) * mpmath.npdf(x, 0, sd), pts, method="gauss-legendre")


def _m(name, v, c, s):
    """E[h(u) | v], u | v ~ N(c v, s^2)."""
    a, b, A, B = H[name]
    mu = c * v
    P = mpmath.ncdf(mu / s)
    pos = mu * P + s * mpmath.npdf(mu / s)
    return a * (mu - pos) + b * pos + A * (1 - P) + B * P


def _ll(name, q, c, s, X):
    t, w = np.polynomial.legendre.leggauss(20)
    cuts = np.arange(-X, X + 1)
    xs = (0.5 * (t + 1)[None, :] + cuts[:-1, None]).ravel()
    ws = np.tile(0.5 * w, cuts.size - 1)
    lv = np.array([float(_l(name, mpmath.mpf(v))) for v in xs])
    u, v = xs[:, None], xs[None, :]
    qf, sf_, omc = float(q), float(s), float(1 - c)
    dens = np.exp(-((u - v) ** 2 + 2 * omc * u * v) / (2 * sf_ ** 2)) / (2 * math.pi * math.sqrt(qf) * sf_)
    return mpmath.mpf(float((ws * lv) @ dens @ (ws * lv)))


def oracle(name, q, theta):
    X = XL.get(name, 40)
    with mpmath.workdps(DPS):
        q, th = mpmath.mpf(q), mpmath.mpf(theta)
        c, s = mpmath.cos(th), mpmath.sqrt(q) * mpmath.sin(th)
        V = _quad(lambda x: PHI[name](x) ** 2, q, X)
        C = (_quad(lambda v: PHI[name](v) * _m(name, v, c, s), q, X, s)
             + mpmath.quad(lambda u: _l(name, u) * _m(name, u, c, s) * mpmath.npdf(u, 0, mpmath.sqrt(q)),
                           list(range(-X, X + 1)), method="gauss-legendre")
             + _ll(name, q, c, s, X))
        return V, C, 2 * V - 2 * C


def check(name, q, theta, errs=None):
    T = tail(sf.kernel(name))
    V, C, D = oracle(name, q, theta)
    v, okv = T.V(np.array([q]))
    c, okc = T.C(np.array([q]), np.array([math.cos(theta)]))
    d, okd = T.D(np.array([q]), np.array([4 * q * math.sin(theta / 2) ** 2]))
    assert okv[0] and okc[0] and okd[0], (name, q, theta, okv, okc, okd)
    e = (abs(v[0] - V) / V, abs(c[0] - C) / V, abs(d[0] - D) / D)
    if errs is not None:
        errs.append((name, q, theta) + tuple(float(x) for x in e))
    assert max(e) < 1e-12, (name, q, theta, e)


@pytest.mark.parametrize("name,q,theta", [("gelu", 2.0 ** 30, math.asin(1e-3)), ("tanh", 2.0 ** 16, 2.0)])
def test_tail_against_mpmath(name, q, theta):
    check(name, q, theta)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gelu", "silu", "elu", "softplus", "tanh", "sigmoid", "mish"])
def test_tail_against_mpmath_many(name):
    """q = 2^16 .. 2^60, theta from 2.5 down to 0.01 (where s = sqrt(q) sin theta > 60), sin theta = 1e-3 at
    q = 2^30, and the smallest theta the series accepts at q = 2^20 (the edge of the corner)."""
    for q in (2.0 ** 16, 2.0 ** 20, 2.0 ** 30, 2.0 ** 60):
        for theta in (2.5, 1.2, 0.3, 0.01):
            if math.sqrt(q) * math.sin(theta) > 60:
                check(name, q, theta)
    check(name, 2.0 ** 30, math.asin(1e-3))
    T, q = tail(sf.kernel(name)), 2.0 ** 20
    th = np.geomspace(1e-4, 1, 81)
    ok = T.D(np.full(th.shape, q), 4 * q * np.sin(th / 2) ** 2)[1] & T.C(np.full(th.shape, q), np.cos(th))[1]
    assert ok[np.argmax(ok):].all()
    check(name, q, th[np.argmax(ok)])


def test_corner_refuses_and_the_engine_falls_back():
    """s = sqrt(q) sin(theta) <= 1: the series refuses (C, D), and the engine's C there is the quadrature's."""
    K = sf.kernel("gelu")
    T = tail(K)
    q = 2.0 ** 20
    th = np.array([2.5e-4, 1e-3, math.pi - 1e-3])
    assert not T.C(q, np.cos(th))[1].any()
    assert not T.D(q, 4 * q * np.sin(th[:2] / 2) ** 2)[1].any()
    M = maps(K)
    before = dict(M.tally)
    c = M.C(np.array([q, q]), np.array([q, q]), q * np.cos([1e-3, 0.5]))
    assert M.tally["quadrature"] == before["quadrature"] + 1 and M.tally["tail"] == before["tail"] + 1
    ref = maps(K, method="quadrature").C(q, q, q * math.cos(1e-3))
    assert abs(c[0] - ref) <= 1e-12 * q


def test_not_localized_has_no_tail():
    assert tail(sf.kernel("relu")) is None and tail(sf.kernel("sin")) is None


def _steps(name, sw, sb, q, qab, n):
    """n layers of the recursion q' = sw V(q) + sb, q12' = sw C(q, q, q12) + sb, d' = sw D by the oracle."""
    out = []
    for _ in range(n):
        c = qab / q
        V, C, D = oracle(name, q, math.acos(c))
        q, qab, d = float(sw * V + sb), float(sw * C + sb), float(sw * D)
        out.append((q, qab, d))
    return out


@pytest.mark.slow
def test_propagate_beyond_the_table_against_mpmath_steps():
    """gelu at sigma_w2 = 3, 4: q grows past 2^20 on the tail; three layers from there against the oracle's
    step-by-step recursion started from propagate's own state at that layer."""
    sw, sb = np.array([3.0, 4.0]), 0.1
    M = maps(sf.kernel("gelu"))
    before = M.tally["tail"]
    r = sf.propagate("gelu", sw, sb, 40)      # two points: the table looked up in Python, then the tail
    assert M.tally["tail"] > before and (r.status == 0).all()
    for i in range(2):
        L = int(np.argmax(r.q[:, i] > 2.0 ** 20))
        ref = _steps("gelu", sw[i], sb, float(r.q[L, i]), float(r.qab[L, i]), 3)
        for k, (q, qab, d) in enumerate(ref):
            assert abs(r.q[L + 1 + k, i] - q) <= 1e-12 * q
            assert abs(r.qab[L + 1 + k, i] - qab) <= 1e-12 * q
            assert abs(r.d[L + 1 + k, i] - d) <= 1e-11 * d


def test_tail_serves_above_expensive_panels():
    """elu's panels cost minutes each (quadrature-node tables): at equal norms above the panels built (the shipped
    table stops at q = 2^14) the engine takes the tail where it certifies, not a panel build or 2-D quadrature."""
    M = maps(sf.kernel("elu"))
    q, theta = 3.0e4, math.acos(0.5)
    assert not M.table.cheap and not M.table.covers(np.array([q]), np.array([q])).any()
    before = dict(M.tally)
    c = M.C(q, q, q * math.cos(theta))
    assert M.tally["tail"] == before["tail"] + 1 and M.tally["quadrature"] == before["quadrature"]
    d = 4 * q * math.sin(theta / 2) ** 2
    assert not M.table.has_distance           # elu's table keeps no distance cells: D is not looked up either
    dv = M.D(q, q, q * math.cos(theta), d)
    assert M.tally["tail"] == before["tail"] + 2 and M.tally["quadrature"] == before["quadrature"]
    V, C, D = oracle("elu", q, theta)
    assert abs(c - C) <= 1e-12 * V and abs(dv - D) <= 1e-12 * D


def test_elu_propagate_beyond_its_table_on_the_tail():
    """elu at sigma_w2 = 3, 4 passes its table's top (q = 2^14) within 40 layers: those points go on with the
    tail (no panel of minutes is built, no 2-D quadrature per layer), two layers against the oracle's steps."""
    sw, sb = np.array([3.0, 4.0]), 0.1
    M = maps(sf.kernel("elu"))
    before = dict(M.tally)
    r = sf.propagate("elu", sw, sb, 40)
    assert M.tally["tail"] > before["tail"] and M.tally["quadrature"] == before["quadrature"]
    assert (r.status == 0).all(), (r.method, r.status)
    L = int(np.argmax(r.q[:, 1] > 2.0 ** 15))
    for k, (q, qab, d) in enumerate(_steps("elu", 4.0, sb, float(r.q[L, 1]), float(r.qab[L, 1]), 2)):
        assert abs(r.q[L + 1 + k, 1] - q) <= 1e-12 * q
        assert abs(r.qab[L + 1 + k, 1] - qab) <= 1e-12 * q
        assert abs(r.d[L + 1 + k, 1] - d) <= 1e-11 * d
