"""The branch-free inverse tangent family the printed maps call (symfield.numeric.kernels.helpers: _atan2, _atan,
_asin, _acos), against mpmath at 40 digits, as plain Python and compiled in a generated module; and its polynomial
against a new least-squares fit of atan at 50 digits."""
import math

import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from symfield.numeric import codegen
from symfield.numeric.kernels import helpers

ULP = 2.0 ** -52


def _inputs(n=4000, seed=3):
    rng = np.random.default_rng(seed)
    mag = 10.0 ** rng.uniform(-30, 30, (2, n))
    sign = np.where(rng.random((2, n)) < 0.5, -1.0, 1.0)
    y, x = sign * mag
    near = rng.uniform(-1, 1, n)                      # |y| ~ |x|, y/x ~ tan(pi/8): the reduction's seams
    y2 = np.concatenate([near, math.tan(math.pi / 8) * (1 + rng.uniform(-1e-6, 1e-6, 200)), [1, -1, 1, -1]])
    x2 = np.concatenate([np.ones(n), np.ones(200), [1, 1, -1, -1]])
    return np.concatenate([y, y2]), np.concatenate([x, x2])


def _ulps(got, want):
    return abs(got - want) / max(abs(want), 2.2250738585072014e-308) / ULP


@pytest.fixture(scope="module")
def compiled():
    """The helpers as numba compiles them: a generated module's copies."""
    return codegen.load(sf.kernel("erf"))


@pytest.mark.parametrize("where", ["python", "compiled"])
def test_atan2_within_two_ulps(where, request):
    f = helpers._atan2 if where == "python" else request.getfixturevalue("compiled")._atan2
    y, x = _inputs(1500 if where == "python" else 4000)
    worst = 0.0
    with mp.workdps(40):
        for a, b in zip(y, x):
            worst = max(worst, _ulps(f(float(a), float(b)), float(mp.atan2(mp.mpf(a), mp.mpf(b)))))
    assert worst <= 2.0, worst


@pytest.mark.parametrize("where", ["python", "compiled"])
def test_special_values_follow_math_atan2(where, request):
    m = helpers if where == "python" else request.getfixturevalue("compiled")
    inf, nan = math.inf, math.nan
    for y, x in [(0.0, 0.0), (-0.0, 0.0), (0.0, -0.0), (-0.0, -0.0), (0.0, -1.0), (-0.0, -1.0), (1.0, 0.0),
                 (-1.0, 0.0), (inf, 1.0), (-inf, 1.0), (1.0, inf), (1.0, -inf), (1e-320, 1.0), (1.0, 1e-320),
                 (1e308, 1e-308)]:
        got, want = m._atan2(y, x), math.atan2(y, x)
        assert got == pytest.approx(want, rel=4 * ULP, abs=0) and math.copysign(1, got) == math.copysign(1, want), (y, x)
    assert math.isnan(m._atan2(nan, 1.0)) and math.isnan(m._atan2(1.0, nan))
    if where == "compiled":      # |x| > 1: NaN (plain Python's math.sqrt raises there instead)
        assert math.isnan(m._asin(1.5)) and math.isnan(m._acos(-1.0000000000000002))


@pytest.mark.parametrize("where", ["python", "compiled"])
def test_atan_asin_acos_within_a_few_ulps(where, request):
    m = helpers if where == "python" else request.getfixturevalue("compiled")
    rng = np.random.default_rng(5)
    xs = np.concatenate([rng.uniform(-1, 1, 1500), 1 - 10.0 ** rng.uniform(-16, -1, 200),
                         -1 + 10.0 ** rng.uniform(-16, -1, 200), [1.0, -1.0, 0.0, -0.0, 1e-300]])
    worst = {"atan": 0.0, "asin": 0.0, "acos": 0.0}
    with mp.workdps(40):
        for v in xs:
            w = mp.mpf(float(v))
            worst["atan"] = max(worst["atan"], _ulps(m._atan(float(v) * 1e3), float(mp.atan(w * 1000))))
            worst["asin"] = max(worst["asin"], _ulps(m._asin(float(v)), float(mp.asin(w))))
            worst["acos"] = max(worst["acos"], _ulps(m._acos(float(v)), float(mp.acos(w))))
    # asin, acos: the rounding of sqrt((1 - x)(1 + x)) comes on top (1 - x is exact near x = 1)
    assert worst["atan"] <= 2.0 and worst["asin"] <= 3.0 and worst["acos"] <= 3.0, worst


def test_polynomial_is_the_least_squares_fit_of_atan():
    """ATAN_P: the weighted least-squares fit of (atan(sqrt z)/sqrt z - 1)/z on [0, tan(pi/8)^2], degree 9, weighted
    to the relative error of atan(u), computed again here at 50 digits on 300 Chebyshev points."""
    with mp.workdps(50):
        b = mp.tan(mp.pi / 8) ** 2
        n, deg = 300, len(helpers.ATAN_P) - 1
        A, r = mp.matrix(n, deg + 1), mp.matrix(n, 1)
        for i in range(n):
            z = b * (1 - mp.cos(mp.pi * (i + mp.mpf(1) / 2) / n)) / 2
            u = mp.sqrt(z)
            w = z / (1 + z * (-mp.mpf(1) / 3 + z / 5))
            for k in range(deg + 1):
                A[i, k] = z ** k * w
            r[i] = (mp.atan(u) / u - 1) / z * w
        c = mp.lu_solve(A.T * A, A.T * r)
        fit = [float(c[k]) for k in range(deg + 1)]
    assert np.allclose(fit, helpers.ATAN_P, rtol=1e-9, atol=0), (fit, helpers.ATAN_P)
    assert helpers.TAN_PI8 == float(mp.tan(mp.pi / 8))


@pytest.mark.parametrize("where", ["python", "compiled"])
def test_gram_sqrt_over_the_whole_range(where, request):
    """_gram_sqrt = sqrt(q1 q2 - q12^2) without overflow or underflow of q1 q2 (exact power-of-two scalings chosen
    without a branch), within 2 ulps of mpmath from q ~ 1e-300 to 1e300 (times the condition number of q1 q2 - q12^2,
    1 + q1 q2/(q1 q2 - q12^2): the products' rounding), and 0 at q12^2 = q1 q2."""
    f = helpers._gram_sqrt if where == "python" else request.getfixturevalue("compiled")._gram_sqrt
    rng = np.random.default_rng(11)
    worst = 0.0
    with mp.workdps(40):
        for e in (-300, -200, -151, -100, 0, 100, 149, 151, 200, 300):
            for _ in range(30):
                q1, q2 = 10.0 ** (e + rng.uniform(-2, 2, 2))
                q12 = rng.uniform(-0.999, 0.999) * math.sqrt(q1) * math.sqrt(q2)
                gram = mp.mpf(q1) * q2 - mp.mpf(q12) ** 2
                cond = float(mp.mpf(q1) * q2 / gram)        # the difference's condition number (to c^2 -> 1)
                worst = max(worst, _ulps(f(q1, q2, q12), float(mp.sqrt(gram))) / (1 + cond))
            assert f(10.0 ** e, 10.0 ** e, 10.0 ** e) == 0.0
    assert worst <= 2.0, worst
