"""Property tests (hypothesis): the general arc-cosine and arcsin formulas at random parameters
and random valid covariances against the literature closed forms in mpmath."""
import math

import mpmath as mp
from hypothesis import given, settings
from hypothesis import strategies as st

import symfield as sf
from oracles import _acos_relu, _erf

slopes = st.floats(-3, 3, allow_nan=False).map(lambda v: round(v, 3))
variances = st.floats(-3, 3).map(lambda e: 10.0 ** e)
corr = st.floats(-1, 1)


@settings(max_examples=40, deadline=None)
@given(a=slopes, b=slopes, q1=variances, q2=variances, c=corr)
def test_abrelu_general_formula(a, b, q1, q2, c):
    act = sf.activation("abrelu", a=a, b=b)
    q12 = c * math.sqrt(q1 * q2)
    ent = _acos_relu(mp.mpf(repr(a)), mp.mpf(repr(b)))
    with mp.workdps(30):
        ref = ent["C"](mp.mpf(q1), mp.mpf(q2), mp.mpf(q12))
        scale = mp.sqrt(ent["V"](mp.mpf(q1)) * ent["V"](mp.mpf(q2))) + mp.mpf(10) ** -300
    assert abs(sf.C(act, q1, q2, q12) - ref) <= 1e-12 * scale


@settings(max_examples=25, deadline=None)
@given(a=st.floats(0.1, 3), b=st.floats(0.1, 3), q1=variances, q2=variances, c=corr)
def test_erf_arcsin_formula(a, b, q1, q2, c):
    a, b = round(a, 3), round(b, 3)
    act = sf.activation("erf", a=a, b=b)
    q12 = c * math.sqrt(q1 * q2)
    ent = _erf(mp.mpf(repr(a)), mp.mpf(repr(b)), 0)
    with mp.workdps(30):
        ref = ent["C"](mp.mpf(q1), mp.mpf(q2), mp.mpf(q12))
        scale = mp.sqrt(ent["V"](mp.mpf(q1)) * ent["V"](mp.mpf(q2)))
    assert abs(sf.C(act, q1, q2, q12) - ref) <= 1e-12 * scale


def test_c_on_the_cauchy_schwarz_bound_in_float64():
    """c = 1 written as q12 = sqrt(q1 q2) in float64 can exceed the bound by an ulp: C stays real and equals
    the exact value sqrt(q1 q2) E[relu(z)^2] = sqrt(q1 q2)/2 (and -> 0 at c = -1)."""
    import math
    for q1, q2 in [(1.0, 10.0), (0.3, 7.0), (2.0, 3.0)]:
        b = math.sqrt(q1 * q2)
        assert abs(float(sf.C("relu", q1, q2, b)) - b / 2) <= 1e-15 * b
        assert abs(float(sf.C("relu", q1, q2, -b))) <= 1e-15 * b
