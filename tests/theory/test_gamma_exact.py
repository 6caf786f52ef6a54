"""gamma = q12/(q - q12) at any depth: the distance recursion against independent mpmath recursions.

The oracles iterate the PLAIN maps q' = sw V(q) + sb, q12' = sw C + sb written here from the literature
closed forms (ReLU arc-cosine kernel, erf arcsin kernel) at hundreds of digits, so q - q12 keeps its digits
there; symfield iterates float64 with d = q_aa + q_bb - 2 q_ab on its own map (docs/theory.md section 7).
"""
import math

import mpmath
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.numeric.distance import rule as distance_rule
from symfield.reports.oracles import mp_expect1, mp_expect2
from symfield.symbolic.activation import activation
from symfield.symbolic.distance import distance
from symfield.symbolic.kernel import kernel


def _relu_maps():
    def C(q, q12):
        th = mpmath.acos(q12 / q)
        return q * (mpmath.sin(th) + (mpmath.pi - th) * mpmath.cos(th)) / (2 * mpmath.pi)
    return (lambda q: q / 2), C


def _erf_maps():
    return (lambda q: 2 / mpmath.pi * mpmath.asin(2 * q / (1 + 2 * q)),
            lambda q, q12: 2 / mpmath.pi * mpmath.asin(2 * q12 / (1 + 2 * q)))


def _oracle_gamma(maps, sw, sb, layers, dps=700):
    """gamma at the given layers from the plain recursion at dps digits (q0 = 1, qab0 = 0)."""
    with mpmath.workdps(dps):
        V, C = maps()
        sw, sb = mpmath.mpf(repr(sw)), mpmath.mpf(repr(sb))
        q, q12, out = sw + sb, sb, {}
        for layer in range(1, max(layers) + 1):
            if layer > 1:
                q, q12 = sw * V(q) + sb, sw * C(q, q12) + sb
            if layer in layers:
                out[layer] = q12 / (q - q12)
        return out


def _worst(p, ref):
    return max(float(abs(p.gamma[layer - 1] - ref[layer]) / ref[layer]) for layer in ref)


def test_relu_gamma_exact_to_2000_layers():
    """The issue's case: float64 subtraction gave 2.4e-4 at layer 100 and inf with status 0 from ~140."""
    layers = (100, 500, 1000, 2000)
    p = sf.propagate("relu", 1.5, 0.1, 2000)
    assert p.status == 0 and p.last_finite == 2000
    assert _worst(p, _oracle_gamma(_relu_maps, 1.5, 0.1, layers)) <= 1e-10


def test_erf_gamma_exact():
    p = sf.propagate("erf", 1.2, 0.05, 1000)
    assert p.status == 0
    assert _worst(p, _oracle_gamma(_erf_maps, 1.2, 0.05, (300, 1000))) <= 1e-10


def test_relu_gamma_underflow_is_flagged_with_its_layer():
    """d = 2 q12/gamma leaves float64's normal range near layer 2470 (gamma ~ (4/3)^l ~ 4e307): status 3 and
    the last layer whose d is normal (gamma there still exact against the oracle); q goes on, finite and exact."""
    p = sf.propagate("relu", 1.5, 0.1, 2600)
    assert p.status == 3
    last = int(p.last_finite)
    tiny = np.finfo(float).tiny
    assert p.d[last - 1] >= tiny > p.d[last]
    ref = _oracle_gamma(_relu_maps, 1.5, 0.1, (last,), dps=900)
    assert abs(p.gamma[last - 1] - float(ref[last])) <= 1e-10 * float(ref[last])
    assert np.all(np.isfinite(p.q)) and abs(p.q[-1] - 0.4) < 1e-15


def test_overflow_grid_status_codes_never_non_finite_with_status_zero():
    sw = np.array([0.5, 1.5, 2.0, 2.5, 1e3, 1e6])[:, None]
    sb = np.array([0.0, 0.1])[None, :]
    p = sf.propagate("relu", sw, sb, 300)
    assert set(np.unique(p.status)) <= {0, 1, 3}
    assert np.all(p.status[-2:] == 1)                      # q overflows: 1e6^l
    ok = p.status == 0
    assert np.all(np.isfinite(p.gamma[:, ok])) and np.all(np.isfinite(p.q[:, ok]))
    # the overflowing points record their last good layer: q there is finite, the next stored row is not
    for i, j in zip(*np.nonzero(p.status == 1)):
        last = int(p.last_finite[i, j])
        assert np.isfinite(p.q[last - 1, i, j]) and not np.isfinite(p.q[last + 1, i, j])


@pytest.mark.parametrize("name", ["relu", "abs", "leaky_relu", "linear", "erf", pytest.param("erf(2, 0.5)", marks=pytest.mark.slow),
                                  "sin", "cos",
                                  "x**3 + x"])
def test_closed_distance_forms_match_the_defining_integral(name):
    """The stable D(q, d): against 2 E[psi^2] - 2 E[psi(u) psi(v)] by mpmath quadrature of the defining
    integrals (reports.oracles) at moderate d; and at d/q = 1e-250 its float64 value against the plain
    difference V + V - 2C evaluated at 400 digits."""
    K = kernel(name)
    D = distance(K)
    assert D.stable, D.method
    f64 = distance_rule(K).fn
    phi = sp.lambdify(sp.Symbol("x"), K.act.expr, "mpmath")
    kinks = tuple(K.kinks)
    for q, d in ((0.8, 0.3), (2.0, 1.0)):
        ref = (2 * mp_expect1(lambda u: phi(u) ** 2, q, kinks=kinks, dps=30)
               - 2 * mp_expect2(phi, phi, q, q, q - d / 2, kinks=kinks, dps=30))
        got = float(f64(np.array([q]), np.array([q]), np.array([q - d / 2]), np.array([d]))[0])
        assert abs(got - float(ref)) <= 1e-9 * abs(float(ref))     # the oracle's own accuracy: an algebra check
    plain = sp.lambdify((sp.Symbol("q", positive=True), sp.Symbol("d", nonnegative=True)),
                        2 * K.V - 2 * K.C.subs({sp.Symbol("q1", positive=True): sp.Symbol("q", positive=True),
                                                sp.Symbol("q2", positive=True): sp.Symbol("q", positive=True)}
                                               ).subs(sp.Symbol("q12", real=True),
                                                      sp.Symbol("q", positive=True) - sp.Symbol("d", nonnegative=True) / 2),
                        "mpmath")
    with mpmath.workdps(400):
        ref = plain(mpmath.mpf("0.9"), mpmath.mpf("0.9e-250"))
    got = float(f64(np.array([0.9]), np.array([0.9]), np.array([0.9]), np.array([0.9e-250]))[0])
    assert abs(got - float(ref)) <= 1e-13 * float(ref)


def _tanh_V(q):
    return mp_expect1(lambda u: mpmath.tanh(u) ** 2, q, dps=mpmath.mp.dps)


def _tanh_D_small(q, d):
    """E[(tanh(u) - tanh(v))^2] for d/q < 1e-12: with u, v = m +- delta/2 (m ~ N(0, v = q - d/4), delta ~ N(0, d)
    independent), D = d E_v[f1^2] + (d^2/4) E_v[f1 f3] + O(d^3), f1 = 1 - t^2, f3 = -2 (1 - t^2)(1 - 3 t^2)."""
    v, dps = q - d / 4, mpmath.mp.dps
    e1 = mp_expect1(lambda u: (1 - mpmath.tanh(u) ** 2) ** 2, v, dps=dps)
    e3 = mp_expect1(lambda u: -2 * (1 - mpmath.tanh(u) ** 2) ** 2 * (1 - 3 * mpmath.tanh(u) ** 2), v, dps=dps)
    return d * e1 + d * d / 4 * e3


@pytest.mark.parametrize("method", ["quadrature", "table"])
def test_tanh_gamma_exact_from_nearly_identical_inputs(method):
    """Two inputs at squared distance d0 = 1e-24 (far below float64's resolution of q - q12): three layers
    against the recursion q' = sw V + sb, d' = sw D written here (mpmath, 30 digits)."""
    sw, sb, q0, d0 = 1.5, 0.05, 0.4, 1e-24
    p = sf.propagate("tanh", sw, sb, 4, q0=q0, d0=d0, method=method)
    with mpmath.workdps(30):
        s, b = mpmath.mpf(repr(sw)), mpmath.mpf(repr(sb))
        q, d = s * mpmath.mpf(repr(q0)) + b, s * mpmath.mpf("1e-24")
        for layer in range(2, 5):
            q, d = s * _tanh_V(q) + b, s * _tanh_D_small(q, d)
            gamma = (2 * q - d) / d
            assert abs(p.gamma[layer - 1] - float(gamma)) <= 1e-11 * float(gamma), (layer, method)


@pytest.mark.slow        # ~22 s of mpmath oracle; the nearly-identical-inputs case stays in the default run
@pytest.mark.parametrize("method", ["quadrature", "table"])
def test_tanh_gamma_exact_from_correlated_inputs(method):
    """c0 = 0.99 (1 - c = 1e-2 .. 1e-3 over the layers, where the small-d rules meet the plain difference):
    two layers against the plain recursion at 30 digits (mpmath quadrature of the defining integrals,
    96-point panels; the difference 2V - 2C loses 3 of the 30 digits)."""
    sw, sb, q0 = 1.5, 0.05, 0.4
    p = sf.propagate("tanh", sw, sb, 3, q0=q0, qab0=0.99 * q0, method=method)
    with mpmath.workdps(30):
        s, b = mpmath.mpf(repr(sw)), mpmath.mpf(repr(sb))
        q, q12 = s * mpmath.mpf(repr(q0)) + b, s * mpmath.mpf(repr(0.99 * q0)) + b
        for layer in range(2, 4):
            q, q12 = (s * _tanh_V(q) + b,
                      s * mp_expect2(mpmath.tanh, mpmath.tanh, q, q, q12, dps=30, degree=5) + b)
            gamma = q12 / (q - q12)
            assert abs(p.gamma[layer - 1] - float(gamma)) <= 1e-11 * float(gamma), (layer, method)


def test_avg_pool_distance_is_the_base_over_k():
    K = kernel(activation("relu", pool="avg", k=2))
    D = distance(K)
    assert D.stable and sp.simplify(D.near_eq - distance(kernel("relu")).near_eq / 2) == 0
    assert math.isclose(float(distance_rule(K).fn(np.array([1.0]), np.array([1.0]), np.array([0.5]),
                                                  np.array([1.0]))[0]),
                        float(distance_rule(kernel("relu")).fn(np.array([1.0]), np.array([1.0]), np.array([0.5]),
                                                                np.array([1.0]))[0]) / 2, rel_tol=1e-15)


def _taylor_D(phi, q, d):
    """D = d E_v[f1^2] + (d^2/4) E_v[f1 f3] (+ O(d^3)), v = q - d/4: derivatives by sympy, mpmath quadrature."""
    x = sp.Symbol("x")
    f1, f3 = (sp.lambdify(x, sp.diff(phi, x, n), "mpmath") for n in (1, 3))
    v, dps = q - d / 4, mpmath.mp.dps
    return (d * mp_expect1(lambda u: f1(u) ** 2, v, dps=dps)
            + d * d / 4 * mp_expect1(lambda u: f1(u) * f3(u), v, dps=dps))


@pytest.mark.parametrize("name, method", [("gelu", "table"), ("gelu", "quadrature"), ("tanh+avg2", "table"),
                                          ("relu+max2", "table")])
def test_gamma_exact_from_nearly_identical_inputs_targets(name, method):
    """d0 = 1e-40 q0: three layers against q' = sw V + sb, d' = sw D written here -- gelu: V and the Taylor
    series of D by mpmath quadrature; tanh+avg2: V_tanh/2 and D_tanh/2 (the avg-pool identities at equal norms,
    E tanh = 0); relu+max2: V = (3/4 + 1/(2 pi)) q and D = (3/4) d (E|grad psi|^2 = P(max > 0) = 3/4; the next
    order is O(theta) ~ 1e-20 here)."""
    sw, sb, q0, d0 = 1.5, 0.05, 0.4, 0.4e-40
    base, pool = (name.split("+") + [None])[:2]
    act = activation(base, pool=pool[:3], k=int(pool[3:])) if pool else base
    p = sf.propagate(act, sw, sb, 4, q0=q0, d0=d0, method=method)
    x = sp.Symbol("x")
    with mpmath.workdps(30):
        s, b = mpmath.mpf(repr(sw)), mpmath.mpf(repr(sb))
        q, d = s * mpmath.mpf(repr(q0)) + b, s * mpmath.mpf(repr(q0)) * mpmath.mpf("1e-40")
        for layer in range(2, 5):
            if name == "gelu":
                phi = x * (1 + sp.erf(x / sp.sqrt(2))) / 2
                f = sp.lambdify(x, phi, "mpmath")
                q, d = s * mp_expect1(lambda u: f(u) ** 2, q, dps=30) + b, s * _taylor_D(phi, q, d)
            elif name == "tanh+avg2":
                q, d = s * _tanh_V(q) / 2 + b, s * _tanh_D_small(q, d) / 2
            else:
                q, d = s * (mpmath.mpf(3) / 4 + 1 / (2 * mpmath.pi)) * q + b, s * mpmath.mpf(3) / 4 * d
            gamma = (2 * q - d) / d
            assert abs(p.gamma[layer - 1] - float(gamma)) <= 1e-11 * float(gamma), (name, layer)
