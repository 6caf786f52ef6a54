"""symfield.numeric.tables: the distance map D(q1, q2, d) = E[(psi(u) - psi(v))^2], d = q1 + q2 - 2 q12,
relative-accurate as c -> 1 (d/q down to 1e-300), where V + V - 2C loses every digit.

Oracles (equal norms: u, v = m +- delta/2, m ~ N(0, q - d/4), delta ~ N(0, d) independent; s2 = d/(4q)):
- s2 <= 1e-8: the Taylor expansion psi(m + h) - psi(m - h) = 2h psi' + h^3 psi'''/3 + O(h^5), E h^2 = d/4,
  E h^4 = 3 d^2/16:  D = d E[psi'(m)^2] + (d^2/4) E[psi'(m) psi'''(m)] + O(d^3)  (relative remainder
  ~ d^2 <= 2e-15 here), the two 1-D expectations by mpmath.quad at 30 digits of the symbolic derivatives;
- s2 >= 1e-4: the defining 2-D integral over (m, delta) by float64 Gauss-Legendre panels (width 1/4,
  16 points; psi(u) - psi(v) loses at most log10(1/sqrt(s2)) = 2 digits there), and one mpmath.quad of
  the same integral at 20 digits with the difference at 40 (slow);
- tanh+avg2: D = D_tanh/2 exactly at equal norms (psi = (phi(u1) + phi(u2))/2), and 2V - 2C by
  symfield's mpmath path at s2 = 0.2;
- relu+max2 (homogeneous, D(q) = q D(1)): an order-statistics decomposition written here,
  D = 2 T1 + 2 T2 (same argmax node / different argmax nodes), with relu(x) - relu(y) from y - x
  without cancellation, and D/d -> E[psi'^2] = 3/4 (error O(theta)) at s2 = 1e-100.
"""
import functools
import math

import mpmath
import numpy as np
import pytest
import sympy as sp
from scipy.special import ndtr

import symfield as sf
from symfield.numeric import tables
from symfield.numeric.kernels import table_maps
from symfield.numeric.quadrature import bvn_cdf

QS = (0.05, 0.4, 3.0)
S2_SMALL = (1e-8, 1e-16, 1e-100)
S2_LARGE = (0.2, 1e-2, 1e-4)
TOL_D = 1e-12
X = sp.Symbol("x")
PHI = {"tanh": sp.tanh(X), "gelu": X * (1 + sp.erf(X / sp.sqrt(2))) / 2}
F64 = {"tanh": np.tanh, "gelu": lambda x: x * ndtr(x)}


@functools.lru_cache(maxsize=None)
def taylor_oracle(name, q, s2):
    """d E[psi'^2] + (d^2/4) E[psi' psi'''], m ~ N(0, q (1 - s2)), by mpmath.quad (22 digits)."""
    d1, d3 = sp.diff(PHI[name], X), sp.diff(PHI[name], X, 3)
    f1, f3 = sp.lambdify(X, d1, "mpmath"), sp.lambdify(X, d3, "mpmath")
    with mpmath.workdps(22):
        sd = mpmath.sqrt(mpmath.mpf(q) * (1 - mpmath.mpf(s2)))
        w = lambda z: mpmath.exp(-z * z / 2) / mpmath.sqrt(2 * mpmath.pi)
        e11 = mpmath.quad(lambda z: w(z) * f1(sd * z) ** 2, [-mpmath.inf, 0, mpmath.inf])
        e13 = mpmath.quad(lambda z: w(z) * f1(sd * z) * f3(sd * z), [-mpmath.inf, 0, mpmath.inf])
        d = 4 * mpmath.mpf(q) * mpmath.mpf(s2)
        return float(d * e11 + d * d / 4 * e13)


def _gl(lo, hi, width, n=16):
    t, w = np.polynomial.legendre.leggauss(n)
    e = np.linspace(lo, hi, int(round((hi - lo) / width)) + 1)
    h = 0.5 * np.diff(e)[:, None]
    return (e[:-1, None] + h * (1 + t)).ravel(), (h * w).ravel()


def f64_oracle(psi, q, s2):
    """2 int_0^inf int n(x) n(y) (psi(a x + b y/2) - psi(a x - b y/2))^2, a = sqrt(q (1 - s2)), b = sqrt(4 q s2)."""
    x, wx = _gl(-12.0, 12.0, 0.25)
    y, wy = _gl(0.0, 12.0, 0.25)
    a, b = math.sqrt(q * (1 - s2)), math.sqrt(4 * q * s2)
    nx = wx * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    ny = wy * np.exp(-y * y / 2) / math.sqrt(2 * math.pi)
    diff = psi(a * x[:, None] + 0.5 * b * y[None, :]) - psi(a * x[:, None] - 0.5 * b * y[None, :])
    return 2.0 * float(nx @ (diff * diff) @ ny)


def table_D(T, q, s2):
    d = 4 * q * s2
    return T.D(q, q, q * (1 - 2 * s2), d)


@pytest.fixture(scope="module", params=["tanh", "gelu"])
def smooth(request):
    return request.param, tables.table(request.param, 0.04, 3.5)


def test_smooth_table_D_small_distance_against_taylor_oracle(smooth):
    name, T = smooth
    assert T.info["D"].startswith("polar rule")
    worst = 0.0
    for q in QS:
        for s2 in S2_SMALL:
            ref = taylor_oracle(name, q, s2)
            got = table_D(T, q, s2)
            err = abs(got - ref) / ref
            worst = max(worst, err)
            assert err <= TOL_D, (name, q, s2, got, ref)
            # the no-numba twin agrees to rounding
            assert abs(table_maps.D(T.arrays(), q, q, q * (1 - 2 * s2), 4 * q * s2) - got) <= 1e-15 * got
    print(f"\n{name}: D small-d max rel err {worst:.1e}, certified D <= {T.error['D']:.1e}")
    assert T.error["D"] <= 1e-13


def test_smooth_table_D_moderate_distance_against_quadrature(smooth):
    name, T = smooth
    worst = 0.0
    for q in QS:
        for s2 in S2_LARGE + (0.7, 0.97):
            ref = f64_oracle(F64[name], q, s2)
            got = table_D(T, q, s2)
            worst = max(worst, abs(got - ref) / ref)
            assert abs(got - ref) <= TOL_D * ref, (name, q, s2, got, ref)
    print(f"\n{name}: D moderate-d max rel err {worst:.1e}")


def test_difference_of_C_loses_digits_where_D_does_not():
    """The reason for D: at s2 = 1e-16, 2V - 2C from the same table has no correct digit."""
    T = tables.table("tanh", 0.3, 0.5)
    q, s2 = 0.4, 1e-16
    ref = taylor_oracle("tanh", q, s2)
    assert abs(table_D(T, q, s2) - ref) <= TOL_D * ref
    naive = 2 * T.V(q) - 2 * T.C(q, q, q * (1 - 2 * s2))
    assert abs(naive - ref) > 0.5 * ref


def test_tanh_avg2_is_half_tanh():
    act = sf.activation("tanh", pool="avg", k=2)
    T = tables.table(act, 0.04, 3.5)
    assert T.info["D"].startswith("polar rule")
    for q in QS:
        for s2 in S2_SMALL:
            ref = taylor_oracle("tanh", q, s2) / 2
            assert abs(table_D(T, q, s2) - ref) <= TOL_D * ref, (q, s2)
        for s2 in S2_LARGE:
            ref = f64_oracle(np.tanh, q, s2) / 2
            assert abs(table_D(T, q, s2) - ref) <= TOL_D * ref, (q, s2)
    q, s2 = 0.4, 0.2   # and against the kernel's own V, C in mpmath (no D = D_phi/k identity used)
    ref = 2 * (float(sf.V(act, q, dps=15)) - float(sf.C(act, q, q, q * (1 - 2 * s2), dps=15)))
    assert abs(table_D(T, q, s2) - ref) <= 1e-13 * float(sf.V(act, q, dps=15)) * 4


@pytest.mark.slow
def test_tanh_D_against_mpmath_defining_integral():
    """One point by mpmath.quad of the 2-D defining integral (20 digits, the difference at 40): ~1 min."""
    q, s2 = 0.4, 1e-4
    b = mpmath.sqrt(4 * mpmath.mpf(q) * s2)
    a = mpmath.sqrt(mpmath.mpf(q) * (1 - mpmath.mpf(s2)))

    def f(x, y):
        with mpmath.workdps(40):
            diff = (mpmath.tanh(a * x + b * y / 2) - mpmath.tanh(a * x - b * y / 2)) / b
        return mpmath.exp(-(x * x + y * y) / 2) * diff * diff
    with mpmath.workdps(20):
        ref = float(2 * mpmath.quad(f, [-mpmath.inf, 0, mpmath.inf], [0, mpmath.inf]) / (2 * mpmath.pi) * b * b)
    T = tables.table("tanh", 0.3, 0.5)
    assert abs(table_D(T, q, s2) - ref) <= TOL_D * ref


# --------------------------------------------------------------------------- relu + max2
def relu_max2_oracle(s2, xw=0.25, n=16, tw=0.5):
    """D(1) = E[(max(0, u1, u2) - max(0, v1, v2))^2], pairs (u_j, v_j) iid N(0, [[1, c], [c, 1]]),
    c = 1 - 2 s2, as 2 T1 + 2 T2:
      T1 = E[(relu(x) - relu(y))^2 F(x, y; c)]  (node 1 the argmax of u and v; y = c x + s t),
      T2 = E[(relu(x) - relu(y))^2 N((x - c y)/s) N((y - c x)/s)]  (x = u1, y = v2 independent; y = x + s w),
    y - x = s t - 2 s2 x resp. s w (no cancellation); Gauss-Legendre panels with the kinks x = 0 and
    y = 0 (per row) as breakpoints."""
    c, s = 1 - 2 * s2, math.sqrt(4 * s2 * (1 - s2))
    # x panels: width xw on [-10, 10], graded geometrically towards the kink x = 0 down to s/4 (the
    # per-row kink y = 0 crosses the rows |x| < 10 s); n Gauss points per panel, rows in panels of tw
    g = s / 4 * 2.0 ** np.arange(60)
    g = g[g < xw]
    e = np.unique(np.concatenate([np.linspace(-10, 10, int(round(20 / xw)) + 1), g, -g]))
    tn, wn = np.polynomial.legendre.leggauss(n)
    h = 0.5 * np.diff(e)[:, None]
    x, wx = (e[:-1, None] + h * (1 + tn)).ravel(), (h * wn).ravel()
    nx = wx * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    def rows(lo, hi, kink, width):
        """per-row panels of [lo, hi] with a breakpoint at kink (arrays over x)."""
        k = np.clip(kink, lo, hi)
        out = []
        for a_, b_ in ((lo, k), (k, hi)):
            n = np.maximum(np.ceil((b_ - a_) / width), 1).astype(int).max()
            e = a_[:, None] + (b_ - a_)[:, None] * np.linspace(0, 1, n + 1)[None, :]
            h = 0.5 * np.diff(e, axis=1)[:, :, None]
            out.append(((e[:, :-1, None] + h * (1 + tn)).reshape(x.size, -1), (h * wn).reshape(x.size, -1)))
        return np.concatenate([o[0] for o in out], 1), np.concatenate([o[1] for o in out], 1)

    def dsq(yx, y):   # (relu(x) - relu(y))^2 from y - x
        X_ = x[:, None]
        same = ((X_ > 0) & (y > 0))
        both_neg = (X_ <= 0) & (y <= 0)
        dd = np.where(same, yx, np.where(both_neg, 0.0, np.maximum(X_, 0) - np.maximum(y, 0)))
        return dd * dd

    ones = np.ones_like(x)
    t, wt = rows(-10 * ones, 10 * ones, -c * x / s, tw)
    y = c * x[:, None] + s * t
    T1 = np.sum(nx[:, None] * wt * np.exp(-t * t / 2) / math.sqrt(2 * math.pi) * dsq(s * t - 2 * s2 * x[:, None], y)
                * bvn_cdf(np.broadcast_to(x[:, None], y.shape), y, c))
    tan = 2 * s2 / s
    lo, hi = -tan * x - 10.0, (tan * x + 10.0) / c if c > 0 else 60 * ones
    w, ww = rows(lo, np.maximum(hi, lo), -x / s, tw)
    y = x[:, None] + s * w
    T2 = np.sum(nx[:, None] * ww * s * np.exp(-y * y / 2) / math.sqrt(2 * math.pi) * dsq(s * w, y)
                * ndtr(tan * x[:, None] - c * w) * ndtr(w + tan * x[:, None]))
    return 2 * T1 + 2 * T2


def test_relu_max2_oracle_identities():
    """The oracle itself: s2 = 1/2 (c = 0) gives 2V - 2 E[psi]^2 = 2 (3/4 + 1/(2 pi)) - (1 + sqrt 2)^2/(2 pi)."""
    exact = 2 * (3 / 4 + 1 / (2 * math.pi)) - (1 + math.sqrt(2)) ** 2 / (2 * math.pi)
    assert abs(relu_max2_oracle(0.5) - exact) <= 1e-14 * exact


def test_relu_max2_table_D():
    act = sf.activation("relu", pool="max", k=2)
    T = tables.table(act)
    assert T.kind == "homogeneous" and T.info["D"].startswith("max-pool h_k rule")
    worst = 0.0
    for s2 in S2_LARGE + (1e-8, 0.7):
        ref = relu_max2_oracle(s2)
        for q in QS:
            got = table_D(T, q, s2) / q
            worst = max(worst, abs(got - ref) / ref)
            assert abs(got - ref) <= TOL_D * ref, (q, s2, got, ref)
    for q in QS:   # D/d = 3/4 + O(theta), theta = 2e-50
        assert abs(table_D(T, q, 1e-100) / (4 * q * 1e-100) - 0.75) <= TOL_D
    print(f"\nrelu+max2: D max rel err {worst:.1e}, certified D <= {T.error['D']:.1e}")
    assert T.error["D"] <= 1e-12
    # unequal norms: D = V1 (sqrt q1 - sqrt q2)^2 + 2 sqrt(q1 q2) s2 R, against the quadrature's V + V - 2C
    for q1, q2, c in [(0.5, 3.0, 0.4), (2.0, 0.1, -0.7)]:
        q12 = c * math.sqrt(q1 * q2)
        ref = float(sf.V(act, q1)) + float(sf.V(act, q2)) - 2 * float(sf.C(act, q1, q2, q12))
        assert abs(T.D(q1, q2, q12, q1 + q2 - 2 * q12) - ref) <= 1e-12 * math.sqrt(q1 * q2)


def test_no_distance_rule_is_detected():
    """elu (kinked: nodes by quadrature) and tanh+max2 (general-kind max-pool) have no cancellation-free
    node rule for D: the table says so before building anything."""
    for act in ("elu", sf.activation("tanh", pool="max", k=2)):
        T = tables.Table(sf.kernel(act))
        T.evaluator()
        assert T.info["D"] == tables.D_DIFF


def test_fallback_path(fresh_caches, monkeypatch, tmp_path):
    """With no distance rule (forced here on tanh) D is V + V - 2C (compiled and scalar), flagged inf."""
    monkeypatch.setattr(tables.store, "path_of", lambda K: tmp_path / f"t_{tables.key(K)}.npz")
    monkeypatch.setattr(tables, "_TABLES", {})
    monkeypatch.setattr(tables.build, "MP_CHECKS", 0)

    def no_rule(self, ev):
        ev.R, self.info["D"] = None, tables.D_DIFF
    monkeypatch.setattr(tables.Table, "_distance_rule", no_rule)
    T = tables.table("tanh", 0.3, 0.4)
    assert T.error["D"] == math.inf and "loses digits" in T.describe()
    q, q12 = 0.35, 0.2
    ref = 2 * T.V(q) - 2 * T.C(q, q, q12)
    assert T.D(q, q, q12, 2 * (q - q12)) == pytest.approx(ref, rel=1e-14)
    assert table_maps.D(T.arrays(), q, q, q12, 2 * (q - q12)) == pytest.approx(ref, rel=1e-14)


@pytest.mark.slow
def test_fallback_is_flagged(fresh_caches, monkeypatch, tmp_path):
    """A kernel without a cancellation-free node rule (elu: kinked, quadrature nodes) says so: D is
    V + V - 2C and its bound is inf, never a claimed accuracy (~40 s: one elu panel by quadrature)."""
    monkeypatch.setattr(tables.store, "path_of", lambda K: tmp_path / f"t_{tables.key(K)}.npz")
    monkeypatch.setattr(tables, "_TABLES", {})
    monkeypatch.setattr(tables.build, "MP_CHECKS", 0)
    T = tables.table("elu", 0.3, 0.4)
    assert T.info["D"] == tables.D_DIFF and T.error["D"] == math.inf and "loses digits" in T.describe()
    q, q12 = 0.35, 0.2
    assert T.D(q, q, q12, 2 * (q - q12)) == pytest.approx(2 * T.V(q) - 2 * T.C(q, q, q12), rel=1e-14)


@pytest.mark.parametrize("name, phi", [pytest.param("softplus", lambda t: mpmath.log1p(mpmath.exp(t)), marks=pytest.mark.slow),
                                       ("sigmoid", lambda t: 1 / (1 + mpmath.exp(-t)))])
def test_phi0_nonzero_panel_zero_is_relative_accurate(name, phi):
    """phi(0) != 0: the R-cells of panel 0 (q down to ~1e-27) come from the modes of phi - phi(0) (its Taylor
    polynomial near 0); from phi itself they reached only 4e-2 (softplus) and the table was refused.
    Oracle: D = 2V - 2C by the tests' nested Gauss-Legendre rules at 50 digits, degree 4 (the cancellation
    costs ~log10(V/D) < 10 of them; degree 3 at 40 digits was off by 1e-12 of D)."""
    from oracles import mp_expect1, mp_expect2
    K = sf.kernel(name)
    T = tables.table(K, 0.0, 2.0 ** -9)
    assert T.panels[0].err["D"] <= TOL_D
    for q, th in ((1e-6, 0.3), (1e-3, 1.1)):
        q12 = q * math.cos(th)
        with mpmath.workdps(50):
            v = mp_expect1(lambda t: phi(t) ** 2, q, dps=50)
            c = mp_expect2(phi, phi, q, q, q12, dps=50, degree=4)
            D = float(2 * v - 2 * c)
        assert abs(T.D(q, q, q12, 2 * q - 2 * q12) - D) <= min(T.error["D"], 10 * TOL_D) * D
