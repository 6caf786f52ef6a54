"""sf.C for max-pools from tables (symfield.numeric.tables.fast_C) and the per-c rule (symfield.numeric.maxrule).

Oracles, none of them the code's own tables: the exact linear max2 map (max = mean + |diff|/2),
exact relu+max2 values (c = 0, +-1), the argmax-decomposition tensor oracle of tests/test_tables.py
(another formula and other coordinates), the mpmath h_k oracle of tests/test_pool.py (slow), and
symfield.numeric.quadrature.max_expect2 (an independent construction of the h_k integral).
"""
import math
import statistics
import time

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.symbolic import gaussian as G
from symfield.numeric import quadrature as Q
from symfield.numeric import tables
from symfield.numeric.maxrule import Rule
from test_tables import max2_C_oracle

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
    assert abs(got - exact) <= 1e-14 * math.sqrt(a * b)
    assert abs(Rule(c, 2, 100.0).w.sum() - 1) <= 1e-14          # h_2 is a probability density


@pytest.mark.parametrize("q,c", [(1.0, -0.5), (1.0, 0.99), (0.4, 0.3), (2.0, -0.6), (1.2, 0.85)])
def test_rule_tanh_vs_argmax_oracle(q, c):
    V = float(sf.V(TANH2, q))
    got = float(Rule(c, 2, q).expect(np.tanh, np.tanh, q, q))
    assert abs(got - max2_C_oracle(np.tanh, q, c)) <= 1e-14 * V


@pytest.mark.parametrize("q,c", [(100.0, -0.99), (65536.0, 0.99), (0.01, 0.5)])
def test_rule_converged_and_vs_max_expect2(q, c):
    """Where the tensor oracle is not resolved: two resolutions of the rule, and max_expect2."""
    V = float(sf.V(TANH2, q))
    a = float(Rule(c, 2, q).expect(np.tanh, np.tanh, q, q))
    b = float(Rule(c, 2, q, sub=2, n=14).expect(np.tanh, np.tanh, q, q))
    assert abs(a - b) <= 1e-14 * V
    if q <= 100:
        assert abs(a - Q.max_expect2(np.tanh, np.tanh, q, q, c * q, 2)) <= 1e-12 * V


def test_relu_max2_fast_C_all_norms():
    """Homogeneous table: C(q1, q2, q12) = sqrt(q1 q2) g(theta) for any norms; exact values at c = 0, +-1
    and max_expect2 elsewhere, in the natural scale sqrt(V(q1) V(q2)) = sqrt(q1 q2) (3/4 + 1/(2 pi))."""
    v1 = 3 / 4 + 1 / (2 * math.pi)
    for q1, q2 in [(1.0, 1.0), (0.01, 0.01), (100.0, 100.0), (0.3, 3.0), (100.0, 0.01)]:
        sq = math.sqrt(q1 * q2)
        for c, exact in [(1.0, v1), (0.0, (1 + math.sqrt(2)) ** 2 / (4 * math.pi)), (-1.0, 1 / math.pi)]:
            assert abs(sf.C(RELU2, q1, q2, c * sq) / sq - exact) <= 1e-12
        for c in (0.99, 0.5, -0.5, -0.99):
            ref = Q.max_expect2(relu, relu, q1, q2, c * sq, 2, kinks=[0.0])
            assert abs(sf.C(RELU2, q1, q2, c * sq) - ref) <= 1e-11 * sq * v1


def _median_call(act, args, n=50):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        sf.C(act, *args)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def test_relu_max2_timing_vs_quadrature():
    sf.C(RELU2, 1.0, 1.0, 0.5)                         # warm-up: table loaded (or built, ~3 s)
    fast = _median_call(RELU2, (1.0, 1.3, 0.5))
    t = time.perf_counter()
    Q.max_expect2(relu, relu, 1.0, 1.3, 0.5, 2, kinks=[0.0])
    slow = time.perf_counter() - t
    print(f"relu+max2 sf.C {fast * 1e6:.0f} us, quadrature {slow * 1e3:.1f} ms, ratio {slow / fast:.0f}")
    assert fast < 1e-3 and slow / fast > 10


def test_tanh_max2_unequal_norms_falls_back_to_quadrature():
    a = sf.C(TANH2, 0.7, 1.3, -0.3)
    b = float(sf.C(TANH2, np.array(0.7), 1.3, -0.3))        # array input: the quadrature path
    assert a == b


@pytest.mark.slow
def test_tanh_max2_table_path_accuracy_and_timing():
    """Equal norms: the panel of q in [1, 2) is built (~2 min) once repeated use pays for it
    (here: explicitly), then sf.C reads it; against the argmax oracle at the natural scale."""
    tables.table(TANH2, 1.0, 1.9)
    for q, c in [(1.0, 0.99), (1.3, -0.5), (1.7, 0.0), (1.9, 0.3)]:
        ref = max2_C_oracle(np.tanh, q, c)
        assert abs(sf.C(TANH2, q, q, c * q) - ref) <= 1e-10 * float(sf.V(TANH2, q))
    fast = _median_call(TANH2, (1.3, 1.3, 0.5))
    t = time.perf_counter()
    Q.max_expect2(np.tanh, np.tanh, 1.3, 1.3, 0.5, 2)
    slow = time.perf_counter() - t
    print(f"tanh+max2 sf.C {fast * 1e6:.0f} us, quadrature {slow * 1e3:.1f} ms")
    assert fast < 1e-3
