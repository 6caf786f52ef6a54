"""symfield.numeric.tables: the polar node rule, certified tables, and propagate's table path.

Oracles: the exact arcsin kernel of erf (the polar rule and an erf table are checked against it at
thousands of points), mpmath quadrature of the defining integrals (sf.V / sf.C / sf.q_map /
sf.qab_map with dps=), exact identities of the max-pooled ReLU (c = 1, 0, -1 and the slope at
c = 1), and the quadrature path of propagate (a different evaluation of the same recursion).
Errors of C are measured against V (its Cauchy-Schwarz scale), as in conftest.TOL.

Tables live in the default cache (SYMFIELD_CACHE or ~/.cache/symfield/codegen/tables): the first
run builds them (tanh, softplus, erf: seconds each; relu+max2: ~20 s), later runs reuse them.
"""
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.numeric import codegen
from symfield.symbolic import formula
from symfield.numeric import evaluate as numeric
from symfield.numeric import tables
from symfield.symbolic.gaussian import q as Q

from conftest import TOL

ROOT = Path(__file__).resolve().parents[2]


def erf_C_exact(q, c):
    """E[erf(u) erf(v)], u, v ~ N(0, q), corr c: (2/pi) arcsin(2 q c/(1 + 2 q)) in mpmath."""
    with mpmath.workdps(30):
        return float(2 / mpmath.pi * mpmath.asin(2 * mpmath.mpf(q) * mpmath.mpf(c) / (1 + 2 * mpmath.mpf(q))))


def mp_recursion(act, sw, sb, depth, dps=15):
    """docs/theory.md sections 1-2 iterated in mpmath with sf.q_map / sf.qab_map (dps quadrature)."""
    with mpmath.workdps(dps):
        qa, qab = mpmath.mpf(sw) + mpmath.mpf(sb), mpmath.mpf(sb)
    rows = [(qa, qab)]
    for _ in range(2, depth + 1):
        qa, qab = sf.q_map(act, qa, sw, sb, dps=dps), sf.qab_map(act, qa, qa, qab, sw, sb, dps=dps)
        rows.append((qa, qab))
    return [(float(a), float(b)) for a, b in rows]


# --------------------------------------------------------------------------- polar rule
@pytest.mark.parametrize("q", [1e-3, 0.5, 5.0, 60.0])
def test_polar_rule_matches_erf_arcsin_kernel(q):
    f = numeric.vectorised(sp.erf(formula.X), numeric.NUMPY_MODULES)
    P_ = tables.polar_coefficients(f, f, q, q, parity=1)
    th = np.array([0.0, 1e-3, 0.05, 0.7, 1.5707, 2.3, 3.1, math.pi])
    got = tables.polar_eval(P_, th)
    ref = np.array([erf_C_exact(q, math.cos(t)) for t in th])
    V = ref[0]
    assert np.max(np.abs(got - ref)) <= 1e-14 * V
    # odd activation: the even modes vanish, so C(q, q, 0) = 0 to rounding
    assert abs(tables.polar_eval(P_, np.array([math.pi / 2]))[0]) <= 1e-15 * V


def test_polar_rule_tanh_matches_mpmath():
    f = np.tanh
    for q, th in [(0.5, 2.2)]:
        got = tables.polar_eval(tables.polar_coefficients(f, f, q, q, parity=1), np.array([th]))[0]
        ref = sf.C("tanh", q, q, q * math.cos(th), dps=15)
        V = sf.V("tanh", q, dps=15)
        assert abs(got - float(ref)) <= 1e-14 * float(V)   # measured ~1e-16


# --------------------------------------------------------------------------- certified tables
@pytest.fixture(scope="module")
def erf_table():
    return tables.table("erf", 0.0, 8.0)


def test_erf_table_bound_is_honest(erf_table):
    """3000 random (q, theta) against the exact arcsin kernel: every error inside the certified bound."""
    T = erf_table
    rng = np.random.default_rng(1)
    q = np.exp(rng.uniform(math.log(1e-6), math.log(7.9), 3000))
    q[:20] = rng.uniform(0, 2.0 ** tables.E0, 20)      # the sqrt(q) panel near 0
    c = np.cos(rng.uniform(0, math.pi, 3000))
    c[:50] = 1 - 10.0 ** rng.uniform(-12, -2, 50)      # near c = 1
    got = T.C(q, q, q * c)
    with mpmath.workdps(30):
        ref = np.array([erf_C_exact(a, b) for a, b in zip(q, c)])
        Vref = np.array([erf_C_exact(a, 1.0) for a in q])
    errC = np.max(np.abs(got - ref) / Vref)
    errV = np.max(np.abs(T.V(q) - Vref) / Vref)
    e = T.error
    print(f"\nerf table: C err {errC:.1e} (bound {e['C']:.1e}), V err {errV:.1e} (bound {e['V']:.1e})")
    assert errC <= e["C"] and errV <= e["V"]
    assert e["C"] < 1e-13 and e["V"] < 1e-13          # and the bound itself is tight enough to be useful
    # odd psi: C(q, q, 0) is exactly 0 and C is relative-accurate near c = 0
    assert np.all(T.C(q, q, 0.0 * q) == 0.0)
    small = q * 1e-9
    assert np.max(np.abs(T.C(q, q, small) / np.array([erf_C_exact(a, 1e-9) for a in q]) - 1)) <= e["C_rel"]


def test_tanh_table_heldout_mpmath_points():
    """Random points never used in the build, against mpmath (dps 15): inside the bound."""
    T = tables.table("tanh", 0.0, 4.0)
    rng = np.random.default_rng(7)
    for _ in range(3):
        q = float(rng.uniform(0.01, 1.5))
        th = float(rng.uniform(0, math.pi))
        ref = float(sf.C("tanh", q, q, q * math.cos(th), dps=15))
        V = float(sf.V("tanh", q, dps=15))
        assert abs(T.C(q, q, q * math.cos(th)) - ref) <= T.error["C"] * V
        assert abs(T.V(q) - V) <= T.error["V"] * V
    assert T.info["evaluator"] == "polar Chebyshev-Fourier rule"
    assert T.bound < 1e-13


def test_relu_max2_homogeneous_table_exact_identities():
    """psi = max(relu(u1), relu(u2)) is homogeneous: one theta-table for all q1, q2. Exact values:
    C(q,q,q) = V = q (3/4 + 1/(2 pi)); C(q,q,0) = E[psi]^2 = q (1 + sqrt 2)^2/(4 pi);
    C(q,q,-q) = 2 E[relu(z)]^2 q = q/pi; dC/dq12 at c = 1 = E[psi'^2] = P(M_2 > 0) = 3/4."""
    act = sf.activation("relu", pool="max", k=2)
    T = tables.table(act)
    assert T.kind == "homogeneous" and T.degree == 1
    for q in (1e-8, 0.3, 7.0, 1e12):
        for c, exact in [(1.0, 3 / 4 + 1 / (2 * math.pi)), (0.0, (1 + math.sqrt(2)) ** 2 / (4 * math.pi)),
                         (-1.0, 1 / math.pi)]:
            assert abs(T.C(q, q, c * q) / q - exact) <= max(T.error["C"], 1e-15) * 2
        h = 1e-8   # C = V - (3/4) q (1 - c) + O((1 - c)^(3/2)): the difference quotient is off by O(sqrt h)
        slope = (T.C(q, q, q) - T.C(q, q, (1 - h) * q)) / (h * q)
        assert abs(slope - 0.75) < 1e-4
    # unequal norms: C(q1, q2, q12) = sqrt(q1 q2) C(1, 1, c), against the quadrature at q1 != q2
    for q1, q2, c in [(0.5, 3.0, 0.4), (2.0, 0.1, -0.7)]:
        ref = float(sf.C(act, q1, q2, c * math.sqrt(q1 * q2)))
        assert abs(T.C(q1, q2, c * math.sqrt(q1 * q2)) - ref) <= 1e-12 * math.sqrt(q1 * q2)


def test_non_monotone_max_pool_not_tabulated():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        act = sf.activation("abs", pool="max", k=2)
    with pytest.raises(NotImplementedError, match="non-monotone"):
        tables.table(act)


def test_inaccurate_table_is_refused(fresh_caches, monkeypatch, tmp_path):
    """A table missing the acceptance level is not used: propagate says so and runs quadrature."""
    monkeypatch.setattr(tables.store, "path_of", lambda K: tmp_path / f"t_{tables.key(K)}.npz")
    monkeypatch.setattr(tables, "_TABLES", {})
    monkeypatch.setattr(tables.build, "ACCEPT", 1e-30)
    monkeypatch.setattr(tables.build, "MP_CHECKS", 0)
    r = sf.propagate("softplus", [1.0], [0.1], 3, method="table")
    assert r.method == "numpy-quadrature" and "held-out" in r.params["table_refused"]
    assert not list(tmp_path.glob("*.npz"))


# --------------------------------------------------------------------------- propagate with tables
def _check_against_mp(r, act, i, sw, sb, depth, tol=1e-10, dps=15):
    ref = mp_recursion(act, sw, sb, depth, dps=dps)
    for layer, (qa, qab) in enumerate(ref, start=1):
        assert abs(r.q[layer - 1, i] - qa) <= tol * qa, (act, layer)
        assert abs(r.qab[layer - 1, i] - qab) <= tol * qa, (act, layer)
        if qab != 0:
            assert abs(r.qab[layer - 1, i] - qab) <= 10 * tol * abs(qab), (act, layer)


def test_propagate_tanh_table_matches_mpmath_recursion():
    r = sf.propagate("tanh", [0.7], [0.05], 4, method="table")
    assert r.method == "numba-table" and r.error_bound < 1e-13
    _check_against_mp(r, "tanh", 0, 0.7, 0.05, 4)


@pytest.mark.slow
def test_propagate_tanh_table_matches_mpmath_recursion_chaotic():
    r = sf.propagate("tanh", [2.5], [0.2], 6, method="table")
    _check_against_mp(r, "tanh", 0, 2.5, 0.2, 6)


def test_propagate_softplus_table_matches_mpmath_recursion():
    r = sf.propagate("softplus", [0.6], [0.05], 3, method="table")
    assert r.method == "numba-table"
    _check_against_mp(r, "softplus", 0, 0.6, 0.05, 3)


def test_propagate_relu_avg2_matches_mpmath_recursion():
    act = sf.activation("relu", pool="avg", k=2)
    sw, sb = np.array([1.0, 3.0]), np.array([0.0, 0.1])
    r = sf.propagate(act, sw, sb, 8)
    assert r.method == "numba-generated"
    for i in range(2):
        _check_against_mp(r, act, i, sw[i], sb[i], 8, tol=TOL["closed_float64"], dps=30)


def test_table_path_equals_quadrature_path():
    """Same recursion, maps from the table vs from quadrature: agree to the table bound (x depth)."""
    sw = np.array([0.3, 1.0, 1.9, 3.5])[:, None]
    sb = np.array([0.0, 0.1])[None, :]
    a = sf.propagate("tanh", sw, sb, 6, method="table")
    b = sf.propagate("tanh", sw, sb, 6, method="quadrature")
    assert a.method == "numba-table" and b.method == "numpy-quadrature"
    np.testing.assert_allclose(a.q, b.q, rtol=1e-13)
    assert np.max(np.abs(a.qab - b.qab) / a.q) < 1e-13
    # odd tanh at sigma_b2 = 0 from uncorrelated inputs: q12 stays exactly 0 on the table path too
    assert np.all(a.qab[:, :, 0] == 0.0)


def test_relu_max2_general_norms_and_status():
    """Homogeneous table: unequal norms run compiled (no quadrature), overflow gives status 1."""
    act = sf.activation("relu", pool="max", k=2)
    sw = np.array([1.0, 2.5, 80.0])
    r = sf.propagate(act, sw, 0.1, 300, qbb0=2.0, qab0=0.5, layers=[1, 2, 3, 300])
    assert r.method == "numba-table"
    assert r.status.tolist() == [0, 0, 1] and np.isnan(r.q[-1, 2])
    for i in range(2):   # one step from the stored layer 2 (q_growth: V = q (3/4 + 1/(2 pi)))
        g = 3 / 4 + 1 / (2 * math.pi)
        assert abs(r.q[2, i] - (sw[i] * g * r.q[1, i] + 0.1)) <= 1e-14 * r.q[2, i]
        assert abs(r.qbb[2, i] - (sw[i] * g * r.qbb[1, i] + 0.1)) <= 1e-14 * r.qbb[2, i]
        ref = sw[i] * float(sf.C(act, r.q[1, i], r.qbb[1, i], r.qab[1, i])) + 0.1
        assert abs(r.qab[2, i] - ref) <= 1e-12 * math.sqrt(r.q[2, i] * r.qbb[2, i])


def test_extension_cap_and_quadrature_fallback(fresh_caches, monkeypatch, tmp_path):
    """Points leaving the table extend it; beyond the cap they finish on the quadrature path."""
    monkeypatch.setattr(tables.store, "path_of", lambda K: tmp_path / "tables" / f"t_{tables.key(K)}.npz")
    monkeypatch.setattr(tables, "_TABLES", {})
    monkeypatch.setattr(tables.geometry, "Q_CAP_EXP", 3)        # q <= 8
    monkeypatch.setattr(tables.build, "MP_CHECKS", 0)
    sw = np.array([0.5, 6.0])                           # softplus: q stays small / grows past 8
    a = sf.propagate("softplus", sw, 0.1, 5, method="table")
    assert a.method == "numba-table+numpy-quadrature" and a.params["points_on_quadrature"] == 1
    b = sf.propagate("softplus", sw, 0.1, 5, method="quadrature")
    np.testing.assert_allclose(a.q, b.q, rtol=1e-13)
    np.testing.assert_allclose(a.qab, b.qab, rtol=1e-13)
    T = tables.table("softplus")
    assert T.q_range[1] == 8.0 and Path(T.info["path"]).parent == tmp_path / "tables"


def test_save_and_reload_roundtrip(erf_table):
    T = erf_table
    back = tables.read(tables.store.path_of(T.K), T.K, tables.Table)
    assert back is not None and sorted(back.panels) == sorted(T.panels)
    np.testing.assert_array_equal(tables.pack(back), tables.pack(T))


def test_codegen_refuses_unsupported_function():
    with pytest.raises(NotImplementedError, match="'gamma'.*Supported:"):
        codegen.module_source("bad", sp.gamma(Q + 1), Q)
    with pytest.raises(NotImplementedError, match="no closed form"):
        codegen.module_source("tanh", sf.kernel("tanh").V, sf.kernel("tanh").C)


@pytest.mark.slow
def test_new_process_reuses_tables_and_code(tmp_path):
    """Cold (build + compile) vs warm (load) wall time of a new process."""
    env = dict(os.environ, SYMFIELD_CACHE=str(tmp_path))
    code = textwrap.dedent("""
        import time; t = time.perf_counter()
        import symfield as sf
        r = sf.propagate("tanh", [0.5, 1.0, 2.0], [0.0, 0.1, 0.2], 30, method="table")
        print(time.perf_counter() - t, r.method, r.params["table_path"])
    """)
    run = lambda: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                 cwd=ROOT, timeout=1800)
    first = run()
    assert first.returncode == 0, first.stderr
    t1, method, path = first.stdout.split()
    mtime = Path(path).stat().st_mtime_ns
    second = run()
    t2 = float(second.stdout.split()[0])
    print(f"\ncold {float(t1):.1f} s, warm {t2:.1f} s")
    assert method == "numba-table" and Path(path).stat().st_mtime_ns == mtime and t2 < float(t1)


@pytest.mark.slow
def test_elu_table_matches_mpmath():
    """A kinked activation (nodes by the float64 quadrature, the slow evaluator)."""
    T = tables.table("elu", 0.25, 2.0)
    assert T.info["evaluator"] == "symfield.numeric quadrature"
    for q, th in [(0.3, 0.4), (1.7, 2.5)]:
        ref = float(sf.C("elu", q, q, q * math.cos(th), dps=15))
        assert abs(T.C(q, q, q * math.cos(th)) - ref) <= T.error["C"] * float(sf.V("elu", q, dps=15))


# --------------------------------------------------------------------------- max-pooled tanh
def max2_C_oracle(phi, q, c):
    """E[phi(max(u1, u2)) phi(max(v1, v2))], pairs (u_j, v_j) i.i.d. N(0, q [[1, c], [c, 1]]), by the
    argmax decomposition (independent of the h_2 density used by symfield.numeric.quadrature.max_expect2):
        C = 2 T1 + 2 T2,  T1 = E[phi(u1) phi(v1) F(x1, y1; c)]   (node 1 the argmax of u and of v),
        T2 = E[phi(u1) phi(v2) N((y2 - c x1)/s) N((x1 - c y2)/s)]   (u1, v2 independent; s = sqrt(1 - c^2)),
    x = u/sqrt(q), y = v/sqrt(q), F the bivariate normal CDF (Owen's T). Tensor Gauss-Legendre, half-unit
    panels on [-9, 9]^2, 12 points each (float64)."""
    from scipy.special import ndtr
    from symfield.numeric.quadrature import bvn_cdf
    e = np.arange(-9, 9.01, 0.5)
    t, w = np.polynomial.legendre.leggauss(12)
    z = (e[:-1, None] + 0.25 * (1 + t)).ravel()
    wz = (0.25 * np.broadcast_to(w, (e.size - 1, 12))).ravel() * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    s = math.sqrt((1 - c) * (1 + c))
    X, T = np.meshgrid(z, z, indexing="ij")
    W = np.outer(wz, wz)
    sq = math.sqrt(q)
    Y = c * X + s * T
    T1 = np.sum(W * phi(sq * X) * phi(sq * Y) * bvn_cdf(X, Y, c))
    T2 = np.sum(W * phi(sq * X) * phi(sq * T) * ndtr((T - c * X) / s) * ndtr((X - c * T) / s))
    return 2 * T1 + 2 * T2


def test_max2_oracle_against_quadrature_and_identities():
    """The oracle itself: agrees with max_expect2 (another construction) and, at c = 0, with E[psi]^2."""
    act = sf.activation("tanh", pool="max", k=2)
    for q, c in [(0.4, 0.3), (2.0, -0.6), (1.2, 0.85)]:
        got = max2_C_oracle(np.tanh, q, c)
        ref = float(sf.C(act, q, q, c * q))
        # max_expect2 is good to ~4e-13 here (the oracle is converged to ~1e-17 under panel refinement):
        # inside tables.QUAD_FLOOR, the allowance a table built on max_expect2 adds to its bound
        assert abs(got - ref) <= tables.QUAD_FLOOR * float(sf.V(act, q))
    m = float(sf.map_value(act, "mean", 0.7, dps=20))
    assert abs(max2_C_oracle(np.tanh, 0.7, 0.0) - m * m) <= 1e-14


@pytest.mark.slow
def test_propagate_tanh_max2_table():
    """tanh + max2 on the table path (nodes by max_expect2, ~85 ms each: the build takes ~5 min per
    q-octave) against a layer recursion with V in mpmath (dps 20) and C from the argmax-decomposition
    oracle (float64, converged to ~1e-17; symfield has no mpmath path for max-pool covariances)."""
    act = sf.activation("tanh", pool="max", k=2)
    sw, sb, depth = [2.5, 3.0], [0.1, 0.1], 5     # q stays in [1, 4]: three q-panels (~5 min each)
    r = sf.propagate(act, sw, sb, depth, method="table")
    assert r.method == "numba-table" and r.error_bound < 1e-10
    for i in range(2):
        q, qab = sw[i] + sb[i], sb[i]
        for layer in range(2, depth + 1):
            c = qab / q
            q, qab = (float(sf.q_map(act, q, sw[i], sb[i], dps=20)),
                      sw[i] * max2_C_oracle(np.tanh, q, c) + sb[i])
            assert abs(r.q[layer - 1, i] - q) <= 1e-10 * q
            assert abs(r.qab[layer - 1, i] - qab) <= 1e-10 * q


@pytest.mark.parametrize("act", ["tanh", "relu", "elu", "abs", "x*erf(x)", ("tanh", "max"), ("relu", "max"),
                                 ("tanh", "avg"), ("relu", "avg"), ("abs", "max")])
def test_rule_kind_is_the_evaluator_the_builder_makes(act):
    """The node evaluator's kind read off C's integrals (what Table.cheap and the build-time guess ask) is the
    kind of the Evaluator actually built: its max-pool rule, its polar rule, or quadrature."""
    from symfield.numeric.tables.nodes import Evaluator, rule_kind   # noqa: PLC0415
    A = sf.activation(act[0], pool=act[1], k=2) if isinstance(act, tuple) else sf.activation(act)
    K = sf.kernel(A)
    ev = Evaluator(K, 0)
    assert rule_kind(K) == ("rule" if ev.maxrule else "polar" if ev.fast else "quadrature")
