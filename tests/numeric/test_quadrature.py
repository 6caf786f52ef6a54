"""symfield.numeric.quadrature against oracles that do not use it: exact formulas, mpmath.quad of the
defining integral, and (2-D tanh) a trapezoidal rule in standardised coordinates, whose error
for integrands analytic in a strip |Im z| < a is ~exp(-2 pi a / step) (step chosen for e^-40)."""
import math
import time
from fractions import Fraction
from functools import lru_cache

import mpmath
import numpy as np
import pytest
from scipy.special import erf as np_erf

from symfield.numeric import quadrature as Q
from symfield.numeric.quadrature import expect1, expect1_many, expect1_vec, expect2, expect2_vec
from symfield.reports.oracles import mp_expect2

QS = [1e-3, 0.1, 1.0, 10.0, 1e3]
PAIRS = [(1e-3, 1e-3), (1.0, 1.0), (1e3, 1e3), (1e-3, 1e3), (2.0, 0.5)]
CS = [-1.0, -0.999999, -0.5, 0.0, 0.3, 0.99, 0.999999, 1.0]


def relu(x):
    return np.maximum(x, 0.0)


def sech4(x):
    return (1 / np.cosh(x)) ** 4


def check(val, ref, rtol, scale=0.0):
    """|val - ref| <= rtol * max(|ref|, scale): relative, absolute against `scale` near 0."""
    ref = float(ref)
    assert abs(val - ref) <= rtol * max(abs(ref), scale), (val, ref, abs(val - ref) / max(abs(ref), scale))


def q12_of(q1, q2, c):
    return c * math.sqrt(q1 * q2)


def c_exact(q1, q2, q12):
    """The correlation the float inputs actually encode (mpf, clamped to [-1, 1])."""
    return max(-1, min(1, mpmath.mpf(q12) / mpmath.sqrt(mpmath.mpf(q1) * q2)))


# ------------------------------------------------------------------ oracles
@lru_cache(maxsize=None)
def mp_ref(name, q, mean=0.0, kinks=()):
    """mpmath.quad (tanh-sinh) of f(x) N(x; mean, q) over mean +- 14 sd, split at sd/2 and integers."""
    fns = {"tanh2": lambda x: mpmath.tanh(x) ** 2, "sech4": lambda x: mpmath.sech(x) ** 4,
           "softplus": lambda x: mpmath.log1p(mpmath.exp(x)), "silu": lambda x: x / (1 + mpmath.exp(-x)),
           "elu": lambda x: x if x > 0 else mpmath.expm1(x)}
    with mpmath.workdps(25):
        s, m = mpmath.sqrt(q), mpmath.mpf(mean)
        lo, hi = m - 14 * s, m + 14 * s
        pts = {lo, hi} | {m + j * s / 2 for j in range(-27, 28)} | {mpmath.mpf(k) for k in range(-40, 41)}
        pts |= {mpmath.mpf(k) for k in kinks}
        pts = sorted(p for p in pts if lo <= p <= hi)
        return mpmath.quad(lambda x: fns[name](x) * mpmath.npdf(x, m, s), pts)


def trap2(f, g, q1, q2, q12, strip=math.pi / 2, Z=12.0):
    """E[f(u) g(v)] by the trapezoidal rule in z1, z2 (u = s1 z1, v = s2 (c z1 + r z2)).
    f, g analytic in |Im x| < strip; steps 2 pi a'/40 with a' = min(0.8 a, 3), at most 0.4."""
    s1, s2 = math.sqrt(q1), math.sqrt(q2)
    c = q12 / (s1 * s2)
    p = Fraction(q1) * Fraction(q2)
    r = math.sqrt(max(float((p - Fraction(q12) ** 2) / p), 0.0))

    def grid(a):
        d = min(0.4, 2 * math.pi * min(0.8 * a, 3.0) / 40)
        z = np.arange(-int(Z / d), int(Z / d) + 1) * d
        return z, d * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)

    z1, w1 = grid(strip / max(s1, s2 * abs(c)))
    a1 = w1 * f(s1 * z1)
    if r == 0:
        return float(np.sum(a1 * g(s2 * c * z1)))
    z2, w2 = grid(strip / (s2 * r))
    rows = max(1, 2_000_000 // z2.size)
    tot = 0.0
    for i in range(0, z1.size, rows):
        v = s2 * (c * z1[i:i + rows, None] + r * z2[None, :])
        tot += float(np.sum(a1[i:i + rows] * (g(v) @ w2)))
    return tot


# ------------------------------------------------------------------ float64, exact oracles
@pytest.mark.parametrize("q", QS)
@pytest.mark.parametrize("m", [0.0, 0.7])
def test_expect1_exact(q, m):
    check(expect1(lambda x: x * x, q, mean=m), q + m * m, 1e-12)
    check(expect1(lambda x: x ** 4, q, mean=m), m ** 4 + 6 * m * m * q + 3 * q * q, 1e-12)
    if q <= 10:
        check(expect1(np.cos, q, mean=m), math.exp(-q / 2) * math.cos(m), 1e-12)
        check(expect1(np.exp, q, mean=m), math.exp(m + q / 2), 1e-12)


@pytest.mark.parametrize("q1,q2", PAIRS)
@pytest.mark.parametrize("c", CS)
def test_expect2_exact(q1, q2, c):
    q12 = q12_of(q1, q2, c)
    sq = math.sqrt(q1 * q2)
    check(expect2(lambda x: x * x, lambda x: x * x, q1, q2, q12), q1 * q2 + 2 * q12 * q12, 1e-12)
    if max(q1, q2) <= 2:
        check(expect2(np.cos, np.cos, q1, q2, q12), math.exp(-(q1 + q2) / 2) * math.cosh(q12), 1e-12)
    with mpmath.workdps(50):  # sin t + (pi - t) cos t with t = acos(c), without cancellation
        cc = c_exact(q1, q2, q12)
        ref = mpmath.sqrt(mpmath.mpf(q1) * q2) / (2 * mpmath.pi) * (mpmath.sqrt(1 - cc * cc) - mpmath.acos(-cc) * -cc)
        ref_erf = 2 / mpmath.pi * mpmath.asin(2 * mpmath.mpf(q12) / mpmath.sqrt((1 + 2 * mpmath.mpf(q1)) * (1 + 2 * mpmath.mpf(q2))))
    check(expect2(relu, relu, q1, q2, q12, kinks=(0,)), ref, 1e-12, scale=1e-300)
    if max(q1, q2) <= 2 or c in (0.3, 0.999999):
        check(expect2(np_erf, np_erf, q1, q2, q12), ref_erf, 1e-12, scale=1e-13 * min(1, sq))


def test_relu_elu_kinks_1d():
    for q in QS:
        check(expect1(relu, q, kinks=(0,)), math.sqrt(q / (2 * math.pi)), 1e-12)
        elu = lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))  # noqa: E731
        check(expect1(elu, q, kinks=(0,)), mp_ref("elu", q, kinks=(0,)), 1e-11)


# ------------------------------------------------------------------ float64, tanh and friends vs mpmath
@pytest.mark.parametrize("q", QS)
def test_tanh_1d(q):
    check(expect1(lambda x: np.tanh(x) ** 2, q), mp_ref("tanh2", q), 1e-11)
    check(expect1(sech4, q), mp_ref("sech4", q), 1e-11)
    check(expect1(lambda x: np.tanh(x) ** 2, q, mean=0.7), mp_ref("tanh2", q, 0.7), 1e-11)


@pytest.mark.parametrize("q", [1.0, 1e3])
def test_smooth_activations_1d(q):
    check(expect1(lambda x: np.logaddexp(0, x), q), mp_ref("softplus", q), 1e-11)
    check(expect1(lambda x: x * 0.5 * (1 + np.tanh(x / 2)), q), mp_ref("silu", q), 1e-11)


def test_trapezoid_oracle_itself():
    """The 2-D oracle reproduces exact values (entire integrand; and tanh at c = 1 vs mpmath)."""
    check(trap2(np.cos, np.cos, 1.0, 2.0, 0.7), math.exp(-1.5) * math.cosh(0.7), 1e-13)
    check(trap2(np.tanh, np.tanh, 1e3, 1e3, 1e3), mp_ref("tanh2", 1e3), 1e-13)


@pytest.mark.parametrize("q1,q2", PAIRS[:4])
@pytest.mark.parametrize("c", CS)
def test_tanh_2d(q1, q2, c):
    q12 = q12_of(q1, q2, c)
    val = expect2(np.tanh, np.tanh, q1, q2, q12)
    scale = math.sqrt(float(mp_ref("tanh2", q1) * mp_ref("tanh2", q2)))  # Cauchy-Schwarz bound
    if c == 0:
        assert abs(val) <= 1e-15 * scale  # odd
    elif abs(c) == 1 and q1 == q2:
        check(val, c * mp_ref("tanh2", q1), 1e-11)
    else:
        check(val, trap2(np.tanh, np.tanh, q1, q2, q12), 1e-11, scale=1e-3 * scale)


def test_timing_tanh_2d():
    best = min(_timed(lambda: expect2(np.tanh, np.tanh, 1e3, 1e3, 500.0)) for _ in range(3))
    print(f"expect2(tanh, q=1e3, c=0.5): {best:.3f} s")
    assert best < 1.5  # ~0.3 s on an idle 2-core machine


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ------------------------------------------------------------------ mpmath mode
def _agree(a, b, digits, sign=1):
    with mpmath.workdps(digits + 20):
        assert abs(a - sign * b) <= mpmath.mpf(10) ** (-digits) * max(abs(b), 1e-300), (a, b)


@pytest.mark.parametrize("N", [15, 30])
@pytest.mark.parametrize("q", [1e-3, 1.0, 1e3])
def test_mp_1d_dps(N, q):
    f = lambda x: mpmath.tanh(x) ** 2  # noqa: E731
    a, b = expect1(f, q, dps=N), expect1(f, q, dps=N + 20)
    assert isinstance(a, mpmath.mpf)
    _agree(a, b, N - 1)
    check(float(a), expect1(lambda x: np.tanh(x) ** 2, q), 1e-13)


def test_mp_1d_vs_mpmath_quad():
    with mpmath.workdps(45):
        for q in (1e-3, 1.0, 1e3):
            s = mpmath.sqrt(q)
            pts = sorted({k * s for k in range(-17, 18)} | {mpmath.mpf(k) for k in range(-40, 41) if abs(k) < 17 * s})
            ref = mpmath.quad(lambda x: mpmath.sech(x) ** 4 * mpmath.npdf(x, 0, s), pts)
            _agree(expect1(lambda x: mpmath.sech(x) ** 4, q, dps=40), ref, 39)


def test_mp_2d_dps15():
    a = expect2(mpmath.tanh, mpmath.tanh, 1, 1, 0.5, dps=15)
    b = expect2(mpmath.tanh, mpmath.tanh, 1, 1, 0.5, dps=35)
    _agree(a, b, 14)
    check(float(b), trap2(np.tanh, np.tanh, 1.0, 1.0, 0.5), 1e-13)


@pytest.mark.slow
def test_mp_2d_dps30():
    """expect2 at dps 30 (Mehler's series) against the nested Gauss-Legendre oracle of reports.oracles at 40."""
    a = expect2(mpmath.tanh, mpmath.tanh, 1, 1, 0.5, dps=30)
    _agree(a, mp_expect2(mpmath.tanh, mpmath.tanh, 1, 1, 0.5, dps=40, degree=5), 29)


# ------------------------------------------------------------------ mpmath: Mehler's series (|corr| <= 0.9)
def _mehler(f, g, q1, q2, q12, dps, kinks=()):
    """quadrature._e2_mehler at dps (None where it declines)."""
    with mpmath.workdps(dps + Q.GUARD):
        return Q._e2_mehler(f, g, *(mpmath.mpf(v) for v in (q1, q2, q12)), [mpmath.mpf(k) for k in kinks], dps)


def _arcsine(q1, q2, q12):
    """E[erf(u) erf(v)] = (2/pi) asin(2 q12/sqrt((1 + 2 q1)(1 + 2 q2))) (the inputs' binary values, 60 digits)."""
    with mpmath.workdps(60):
        q1, q2, q12 = (mpmath.mpf(v) for v in (q1, q2, q12))
        return 2 / mpmath.pi * mpmath.asin(2 * q12 / mpmath.sqrt((1 + 2 * q1) * (1 + 2 * q2)))


@pytest.mark.parametrize("q1, q2, q12", [(1, 1, 0.5), (0.01, 0.01, -0.004), (2, 0.5, -0.3), (1, 1, 0.9),
                                         (1, 1, -0.9), (50, 30, 25), (1e4, 1e4, 5e3)])
def test_mehler_matches_erf_closed_form(q1, q2, q12):
    """erf integrated as if it had no closed form: the series (certified, not declined) to 30 digits."""
    got = _mehler(mpmath.erf, mpmath.erf, q1, q2, q12, 30)
    assert got is not None
    _agree(got, _arcsine(q1, q2, q12), 30)
    assert expect2(mpmath.erf, mpmath.erf, q1, q2, q12, dps=30) == got


def test_mehler_matches_2d_rule_and_kinks():
    """tanh against the 2-D rule (:func:`_e2_mp`, conditional form) at 20 digits; relu (kink at 0, Hermite
    coefficients decaying only like k^(-3/4)) against the arc-cosine kernel."""
    with mpmath.workdps(30):
        ref = Q._e2_mp(mpmath.tanh, mpmath.tanh, mpmath.mpf(3), mpmath.mpf("0.7"), mpmath.mpf("-1.1"), [], 20)
    _agree(_mehler(mpmath.tanh, mpmath.tanh, 3, "0.7", "-1.1", 20), ref, 19)
    r = lambda x: x if x > 0 else mpmath.mpf(0)  # noqa: E731
    with mpmath.workdps(40):
        th = mpmath.acos(mpmath.mpf("0.8"))
        ref = 2 / (2 * mpmath.pi) * (mpmath.sin(th) + (mpmath.pi - th) * mpmath.cos(th))
    _agree(_mehler(r, r, 1, 4, "1.6", 20, kinks=(0,)), ref, 20)


def test_mehler_declines_what_it_cannot_certify(monkeypatch):
    """A value that cancels to 0 (E[u He_3(v)] = 0) and a series cut too early (tail bound above
    10^-dps |value|) are declined; expect2 then answers by the 2-D rule. |corr| > 0.9 never tries the series."""
    he3 = lambda x: x ** 3 - 3 * x  # noqa: E731
    assert _mehler(lambda x: x, he3, 1, 1, 0.5, 12) is None
    assert abs(expect2(lambda x: x, he3, 1, 1, 0.5, dps=12)) < 1e-12
    monkeypatch.setattr(Q, "_terms", lambda rho, N: 2)
    assert _mehler(mpmath.erf, mpmath.erf, 1, 1, 0.5, 12) is None
    _agree(expect2(mpmath.erf, mpmath.erf, 1, 1, 0.5, dps=12), _arcsine(1, 1, 0.5), 12)
    monkeypatch.setattr(Q, "_e2_mehler", lambda *a: pytest.fail("series tried at |corr| > 0.9"))
    _agree(expect2(mpmath.erf, mpmath.erf, 1, 1, 0.95, dps=12), _arcsine(1, 1, 0.95), 12)


def test_mp_2d_exact_and_degenerate():
    r = lambda x: x if x > 0 else mpmath.mpf(0)  # noqa: E731
    with mpmath.workdps(40):
        th = mpmath.acos(mpmath.mpf(-0.5))
        ref = mpmath.mpf(1) / (2 * mpmath.pi) * (mpmath.sin(th) + (mpmath.pi - th) * mpmath.cos(th))
    _agree(expect2(r, r, 2, 0.5, -0.5, kinks=(0,), dps=20), ref, 20)
    t2 = expect1(lambda x: mpmath.tanh(x) ** 2, 0.3, dps=20)
    _agree(expect2(mpmath.tanh, mpmath.tanh, 0.3, 0.3, 0.3, dps=20), t2, 19)
    _agree(expect2(mpmath.tanh, mpmath.tanh, 0.3, 0.3, -0.3, dps=20), t2, 19, sign=-1)
    assert abs(expect2(mpmath.tanh, mpmath.tanh, 0.3, 0.3, 0, dps=20)) < 1e-25


def test_mp_kink_control():
    a = mpmath.mpf("0.123")
    f = lambda x: abs(x - a)  # noqa: E731
    with pytest.raises(ArithmeticError, match="exceeds the required"):
        expect1(f, 1, dps=30)
    with mpmath.workdps(40):
        ref = 2 * mpmath.npdf(a) + a * (2 * mpmath.ncdf(a) - 1)
    _agree(expect1(f, 1, kinks=(a,), dps=30), ref, 30)


# ------------------------------------------------------------------ vector helpers
def test_vec_helpers():
    q = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(expect1_vec(np.cos, q), np.exp(-q / 2), rtol=1e-13)
    assert expect1_many is expect1_vec
    out = expect1_vec(lambda x: x * x, q[:, None], mean=np.array([0.0, 1.0]))
    assert out.shape == (3, 2) and out.dtype == float
    np.testing.assert_allclose(out, q[:, None] + np.array([0.0, 1.0]), rtol=1e-13)
    out = expect2_vec(lambda x: x * x, lambda x: x * x, q, 1.0, np.array([[0.1], [-0.2]]))
    assert out.shape == (2, 3)
    np.testing.assert_allclose(out, q + 2 * np.array([[0.1], [-0.2]]) ** 2, rtol=1e-13)
    mo = expect1_vec(lambda x: x * x, [0.5, 2], dps=20)
    assert mo.dtype == object and isinstance(mo[0], mpmath.mpf)
    _agree(mo[1], mpmath.mpf(2), 19)


# ---------------------------------------------------------------- the smooth float64 rule (nested trapezoids)
def _smooth_cases():
    rng = np.random.default_rng(5)
    q1, q2 = 10 ** rng.uniform(-3, 1.5, (2, 40))
    c = np.concatenate([rng.uniform(-1, 1, 20), 1 - 10 ** rng.uniform(-12, -1, 10), -1 + 10 ** rng.uniform(-12, -1, 10)])
    return q1, q2, c * np.sqrt(q1 * q2)


@pytest.mark.parametrize("name", ["sin", "cos-exp", "erf"])
def test_smooth_rule_against_closed_forms(name):
    """E[f(u) g(v)] in closed form: sin sin = e^(-(q1+q2)/2) sinh q12; cos(u) e^(v/2) = e^(-q1/2 + q2/8) cos(q12/2);
    erf erf = (2/pi) arcsin(2 q12/sqrt((1 + 2 q1)(1 + 2 q2))). Accepted rows are within 1e-14 of the scale
    sqrt(E f^2 E g^2); a row that is not accepted is still right through expect2_vec's panel rule."""
    from symfield.numeric.quadrature import smooth2
    q1, q2, q12 = _smooth_cases()
    if name == "sin":
        f = g = np.sin
        want = np.exp(-(q1 + q2) / 2) * np.sinh(q12)
        scale = np.sqrt((1 - np.exp(-2 * q1)) * (1 - np.exp(-2 * q2))) / 2
    elif name == "cos-exp":
        f, g = np.cos, (lambda x: np.exp(x / 2))
        want = np.exp(-q1 / 2 + q2 / 8) * np.cos(q12 / 2)
        scale = np.sqrt((1 + np.exp(-2 * q1)) / 2 * np.exp(q2 / 2))
    else:
        f = g = np_erf
        want = 2 / math.pi * np.arcsin(2 * q12 / np.sqrt((1 + 2 * q1) * (1 + 2 * q2)))
        scale = 2 / math.pi * np.sqrt(np.arcsin(2 * q1 / (1 + 2 * q1)) * np.arcsin(2 * q2 / (1 + 2 * q2)))
    got, ok = smooth2(f, g, q1, q2, q12)
    assert ok.sum() >= 30
    assert np.all(np.abs(got[ok] - want[ok]) <= 1e-14 * scale[ok] + 1e-300)
    vec = expect2_vec(f, g, q1, q2, q12)
    assert np.all(np.abs(vec - want) <= 1e-10 * scale)


def test_smooth_rule_refuses_what_it_cannot_resolve():
    """tanh at q = 1e4 has its poles within 0.016 of the real z axis: the trapezoids disagree, no row is accepted,
    and expect2_vec falls back to the panel rule (as expect2 point by point)."""
    from symfield.numeric.quadrature import smooth2
    q = np.array([1e4, 2e4]), np.array([1e4, 1e4]), np.array([5e3, -7e3])
    got, ok = smooth2(np.tanh, np.tanh, *q)
    assert not ok.any()
    vec = expect2_vec(np.tanh, np.tanh, *q)
    assert np.array_equal(vec, [expect2(np.tanh, np.tanh, a, b, c) for a, b, c in zip(*q)])
    kinked = expect2_vec(lambda x: np.maximum(x, 0), lambda x: np.maximum(x, 0), 1.0, 1.0, 0.5, kinks=(0.0,))
    assert abs(kinked - (math.sqrt(3) / 2 + (math.pi - math.acos(0.5)) * 0.5) / (2 * math.pi)) < 1e-13
