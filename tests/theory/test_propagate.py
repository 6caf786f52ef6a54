"""propagate: generated-Numba depth recursions (closed forms) and the NumPy quadrature fallback.

Conventions checked here (docs/theory.md section 1): row 0 of every result array is layer l = 1, the
LINEAR layer (q = sigma_w2 q0 + sigma_b2); the first nonlinear layer is l = 2, i.e. row 1.

Errors of q12 are measured against q (its Cauchy-Schwarz scale, as in conftest.TOL), since q12
can be exactly 0 (odd activations at sigma_b2 = 0).

These tests use the default code cache (SYMFIELD_CACHE or ~/.cache/symfield/codegen), so a
second run reuses compiled code; the cache test uses its own temporary directory.
"""
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy as sp

import symfield as sf
from symfield.numeric import codegen, grid
from symfield.numeric.maps import maps
from symfield.symbolic.distance import distance
from symfield.symbolic.gaussian import q as Q, q1 as Q1, q2 as Q2, q12 as Q12

from conftest import TOL

ROOT = Path(__file__).resolve().parents[2]

SW = np.array([0.5, 1.0, 2.0, 3.0])
SB = np.array([0.0, 0.05, 0.3])


def mp_recursion(act, sw, sb, depth, q0=1.0, qab0=0.0, qbb0=None, dps=30, with_qab=True):
    """The recursion of docs/theory.md sections 1-2 iterated with sf.q_map / sf.qab_map in mpmath."""
    with mpmath.workdps(dps):
        w, b = mpmath.mpf(sw), mpmath.mpf(sb)
        qa = w * mpmath.mpf(q0) + b
        qb = w * mpmath.mpf(q0 if qbb0 is None else qbb0) + b
        qab = w * mpmath.mpf(qab0) + b
    rows = [(qa, qb, qab)]
    for _ in range(2, depth + 1):
        new_qa = sf.q_map(act, qa, sw, sb, dps=dps)
        new_qb = new_qa if qbb0 is None else sf.q_map(act, qb, sw, sb, dps=dps)
        qab = sf.qab_map(act, qa, qb, qab, sw, sb, dps=dps) if with_qab else qab
        qa, qb = new_qa, new_qb
        rows.append((qa, qb, qab))
    return [(float(a), float(b), float(c)) for a, b, c in rows]


def _compare(r, act, i, j, depth, tol, **kw):
    ref = mp_recursion(act, SW[i], SB[j], depth, **kw)
    for layer, (qa, qb, qab) in enumerate(ref, start=1):
        got_q, got_qab = r.q[layer - 1, i, j], r.qab[layer - 1, i, j]
        assert abs(got_q - qa) <= tol * qa, (act, layer, got_q, qa)
        if kw.get("with_qab", True):
            assert abs(got_qab - qab) <= tol * math.sqrt(qa * qb), (act, layer, got_qab, qab)
        if r.qbb is not None:
            assert abs(r.qbb[layer - 1, i, j] - qb) <= tol * qb


@pytest.mark.parametrize("act", ["relu", "erf", "leaky_relu(0.2)", "sin"])
def test_generated_matches_mpmath(act):
    depth = 12
    r = sf.propagate(act, SW[:, None], SB[None, :], depth)
    assert r.method == "numba-generated"
    assert r.q.shape == (depth, 4, 3) and r.grid_shape == (4, 3)
    assert list(r.layers) == list(range(1, depth + 1))
    assert not r.status.any()
    for i, j in [(0, 0), (1, 1), (2, 2), (3, 0), (3, 2)]:
        _compare(r, act, i, j, depth, TOL["closed_float64"])


def test_generated_general_norms_matches_mpmath():
    """q_aa != q_bb: the second variance has its own recursion and C(qa, qb, q12) is used."""
    r = sf.propagate("erf", SW[:, None], SB[None, :], 8, q0=1.0, qbb0=2.5, qab0=0.7)
    assert r.qbb is not None and r.qbb.shape == r.q.shape
    for i, j in [(1, 1), (3, 2)]:
        _compare(r, "erf", i, j, 8, TOL["closed_float64"], q0=1.0, qbb0=2.5, qab0=0.7)
    np.testing.assert_allclose(r.c, r.qab / np.sqrt(r.q * r.qbb))


def test_tanh_fallback_variance_matches_mpmath():
    """tanh has no closed form: NumPy recursion with quadrature maps. q layers vs mpmath dps 30."""
    depth = 4
    r = sf.propagate("tanh", SW[[0, 3], None], SB[None, [0, 2]], depth, method="quadrature")
    assert r.method == "numpy-quadrature"
    ref = mp_recursion("tanh", SW[3], SB[2], depth, with_qab=False)
    for layer, (qa, _, _) in enumerate(ref, start=1):
        assert abs(r.q[layer - 1, 1, 1] - qa) <= TOL["quad_float64"] * qa
    # odd activation at sigma_b2 = 0, qab0 = 0: q12 stays exactly 0 (C(q, q, 0) = E[tanh]^2 = 0)
    assert np.all(np.abs(r.qab[:, :, 0]) <= 1e-14 * r.q[:, :, 0])


@pytest.mark.slow
def test_tanh_fallback_covariance_matches_mpmath():
    """q12 layers vs mpmath (a 2-D mpmath quadrature per call: dps 15, one point, 3 layers)."""
    r = sf.propagate("tanh", 3.0, 0.3, 3, method="quadrature")
    ref = mp_recursion("tanh", 3.0, 0.3, 3, dps=15)
    for layer, (qa, _, qab) in enumerate(ref, start=1):
        assert abs(r.q[layer - 1] - qa) <= TOL["quad_float64"] * qa
        assert abs(r.qab[layer - 1] - qab) <= TOL["quad_float64"] * qa


def test_relu_exact_laws():
    sw = np.array([0.5, 1.0, 2.0, 3.0, 7.0])
    r = sf.propagate("relu", sw, 0.0, 30)
    # sigma_b2 = 0: q grows by exactly sigma_w2/2 per nonlinear layer (V = q/2)
    np.testing.assert_allclose(r.q[1:] / r.q[:-1], np.broadcast_to(sw / 2, (29, 5)), rtol=1e-15)
    # row 1 = layer l = 2 = the first nonlinear layer: gamma = 1/(pi - 1) (docs/theory.md section 7);
    # row 0 (linear layer from uncorrelated inputs) has q12 = 0, gamma = 0.
    np.testing.assert_allclose(r.gamma[1], 1 / (math.pi - 1), rtol=1e-14)
    assert np.all(r.gamma[0] == 0)


def test_residual_option():
    sw, sb = np.array([0.5, 2.0, 3.0]), 0.1
    still = sf.propagate("relu", sw, sb, 20, residual=0.0)
    np.testing.assert_array_equal(still.q, np.broadcast_to(sw + sb, still.q.shape))
    np.testing.assert_array_equal(still.qab, np.broadcast_to(np.full(3, sb), still.qab.shape))
    alpha = 0.3
    for act in ("erf", "relu"):
        r = sf.propagate(act, sw, sb, 15, residual=alpha)
        qh = sw * 1.0 + sb
        for layer in range(1, 16):
            if layer > 1:
                qh = qh + alpha**2 * sf.q_map(act, qh, sw, sb)
            np.testing.assert_allclose(r.q[layer - 1], qh, rtol=1e-13)


def test_layers_storage_and_status():
    sw = np.array([1.0, 50.0, 2.5])[:, None]
    sb = np.array([0.0, 0.2])
    full = sf.propagate("relu", sw, sb, 400)
    some = sf.propagate("relu", sw, sb, 400, layers=[400, 1, 37, 37])
    assert list(some.layers) == [1, 37, 400] and some.q.shape == (3, 3, 2)
    np.testing.assert_array_equal(some.q, full.q[[0, 36, 399]])
    np.testing.assert_array_equal(some.qab, full.qab[[0, 36, 399]])
    # sigma_w2 = 50: q grows ~25x per layer and overflows; the other points are untouched
    np.testing.assert_array_equal(full.status, [[0, 0], [1, 1], [0, 0]])
    assert np.all(np.isfinite(full.q[:, [0, 2]])) and np.all(np.isfinite(full.qab[:, [0, 2]]))
    assert np.isnan(full.q[-1, 1]).all() and np.isfinite(full.q[100, 1]).all()
    assert full.n_failed == 2


def test_clamped_gram_determinant():
    """q1 q2 - q12^2 rounding below 0 at c = 1 must not produce NaN in generated code."""
    mod = codegen.load(sf.kernel("relu"))
    M = codegen.no_data()
    rng = np.random.default_rng(0)
    for a, b in rng.uniform(0.01, 100, size=(200, 2)):
        c12 = math.sqrt(a * b)
        for v in (c12, math.nextafter(c12, 0), math.nextafter(c12, math.inf)):
            out = mod.C(M, a, b, v)
            assert math.isfinite(out) and abs(out - c12 / 2) <= 1e-7 * c12
    assert mod.C(M, 2.0, 2.0, 2.0) == mod.V(M, 2.0)
    src = Path(codegen.write("relu", sf.kernel("relu").V, sf.kernel("relu").C, distance(sf.kernel("relu")))).read_text()
    assert "_gram_sqrt(q1, q2, q12)" in src and "math.sqrt(max(a * b - c * c, 0.0)) * g" in src
    # large q: q1*q2 would overflow float64, the scaled form does not
    for a in (1e160, 3e200, 1e300):
        assert mod.V(M, a) == a / 2 and abs(mod.C(M, a, a, a) / mod.V(M, a) - 1) <= 4e-16
        assert abs(mod.C(M, a, 2 * a, 0.5 * a) / a - float(sf.C("relu", 1, 2, 0.5, dps=20))) < 1e-14


def test_allow_list_names_the_function():
    with pytest.raises(NotImplementedError, match="'besselj'"):
        codegen.module_source("bad", sp.besselj(0, Q), Q12)
    with pytest.raises(NotImplementedError, match="Integral"):
        codegen.module_source("tanh", sf.kernel("tanh").V, Q12)
    # stable form of sin's C: no exp(2*q12) left (it would overflow for q12 > 355)
    assert "2*q12" not in codegen.print_map(sf.kernel("sin").C, "C", (Q1, Q2, Q12))


def _run(code, env=None, timeout=300):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_cache_reused_in_new_process(tmp_path):
    env = dict(os.environ, SYMFIELD_CACHE=str(tmp_path))
    code = """
        import time, symfield as sf
        from symfield.numeric import codegen
        t = time.perf_counter()
        r = sf.propagate("leaky_relu(0.2)", [1.0, 2.0], 0.1, 50)
        print(time.perf_counter() - t, r.method)
        import glob
        print(glob.glob(str(codegen.cache_dir() / "*.py"))[0])
    """
    first, method, path = _run(code, env).split()
    assert method == "numba-generated"
    path = Path(path)
    assert path.parent == tmp_path / "codegen" and path.exists()
    mtime = path.stat().st_mtime_ns
    compiled = {f: f.stat().st_mtime_ns for f in (path.parent / "__pycache__").glob(path.stem + "*.nb[ic]")}
    assert any(f.suffix == ".nbi" for f in compiled)
    second, method2, _ = _run(code, env).split()
    # the new process neither rewrote the module nor recompiled it (numba rewrites index and data on a miss)
    assert method2 == method and path.stat().st_mtime_ns == mtime and len(list(path.parent.glob("*.py"))) == 1
    assert {f: f.stat().st_mtime_ns for f in compiled} == compiled
    print(f"\nfirst call (generate + compile) {float(first):.2f} s, new process (cached) {float(second):.2f} s")


BAD = [
    (dict(depth=0), ValueError, r"The 'depth' parameter of propagate must be an integer >= 1\. Got 0 instead\."),
    (dict(depth=2.5), TypeError, r"'depth' parameter of propagate must be an integer >= 1\. Got 2\.5"),
    (dict(sigma_w2=[1.0, 2.0, 3.0], sigma_b2=[0.1, 0.2]), ValueError, r"shape \(3,\).*shape \(2,\)"),
    (dict(sigma_w2=math.nan), ValueError, r"'sigma_w2' parameter of propagate must be a finite float >= 0\. Got nan"),
    (dict(sigma_b2=-0.1), ValueError, r"'sigma_b2' parameter of propagate"),
    (dict(q0=0.0), ValueError, r"'q0' parameter of propagate must be a finite float > 0\. Got 0\.0"),
    (dict(q0=-1.0), ValueError, r"'q0' parameter"),
    (dict(qab0=1.5), ValueError, r"'qab0' parameter of propagate must be a covariance"),
    (dict(layers=[0, 3]), ValueError, r"'layers' parameter of propagate must be a list of layer indices in 1\.\.depth"),
    (dict(layers=[11]), ValueError, r"'layers' parameter"),
    (dict(residual=-1.0), ValueError, r"'residual' parameter of propagate must be a finite float >= 0"),
    (dict(method="fast"), ValueError, r"'method' parameter of propagate must be one of \('auto', 'table', 'quadrature'\)\. Got 'fast'"),
    (dict(method=1), TypeError, r"'method' parameter of propagate must be one of"),
]


@pytest.mark.parametrize("kw,exc,match", BAD)
def test_bad_input(kw, exc, match):
    args = dict(act="relu", sigma_w2=1.0, sigma_b2=0.1, depth=10) | kw
    with pytest.raises(exc, match=match):
        sf.propagate(**args)


def test_bad_input_before_numba_import():
    out = _run(f"""
        import sys, math, symfield as sf
        n = 0
        for kw in {[b[0] for b in BAD]!r}.__iter__():
            args = dict(act="relu", sigma_w2=1.0, sigma_b2=0.1, depth=10) | kw
            try:
                sf.propagate(**args)
            except (ValueError, TypeError):
                n += 1
        print(n, "numba" in sys.modules)
    """.replace("nan", "math.nan"))
    assert out.split() == [str(len(BAD)), "False"]


def test_speed_against_numpy_loop():
    """relu, 256 x 256 grid, depth 100: generated kernel vs the same recursion as a NumPy loop."""
    sw = np.linspace(0.5, 4.0, 256)[:, None]
    sb = np.linspace(0.0, 1.0, 256)[None, :]
    sf.propagate("relu", 1.0, 0.0, 3)  # load / compile outside the timing
    t_sf = math.inf
    for _ in range(3):  # best of 3: the machine may be shared
        t = time.perf_counter()
        r = sf.propagate("relu", sw, sb, 100)
        t_sf = min(t_sf, time.perf_counter() - t)
    out_q, out_qab, t_np = *_numpy_relu_loop(sw, sb), math.inf
    for _ in range(3):
        t = time.perf_counter()
        _numpy_relu_loop(sw, sb)
        t_np = min(t_np, time.perf_counter() - t)
    np.testing.assert_allclose(r.q, out_q, rtol=1e-13)
    np.testing.assert_allclose(r.qab, out_qab, rtol=1e-12)
    print(f"\nrelu 256x256 depth 100 (best of 3): propagate {t_sf:.3f} s, numpy loop {t_np:.3f} s, "
          f"numpy/propagate {t_np / t_sf:.2f}x")
    assert t_sf < 30


def _numpy_relu_loop(sw, sb):
    """The ReLU recursion (docs/theory.md section 3) by hand as a vectorised NumPy loop: the baseline."""
    s2, b2 = np.broadcast_arrays(sw, sb)
    q, qab = s2 + b2, b2.copy()
    out_q, out_qab = np.empty((100,) + q.shape), np.empty((100,) + q.shape)
    out_q[0], out_qab[0] = q, qab
    for layer in range(1, 100):
        root = np.sqrt(np.maximum(q * q - qab * qab, 0.0))
        qab = s2 * (root + qab * (np.pi - np.arctan2(root, qab))) / (2 * np.pi) + b2
        q = s2 * q / 2 + b2
        out_q[layer], out_qab[layer] = q, qab
    return out_q, out_qab


def test_numpy_path_equals_generated_path():
    """The same recursion text run by both number systems (fallback forced on a closed form)."""
    K = sf.kernel("relu")
    sw = np.array([0.5, 2.0, 50.0])
    sb = np.array([0.1, 0.0, 0.2])
    store = np.array([1, 2, 10, 300], dtype=np.int64)
    # residual alpha^2 = 0.25 at sigma_w2 = 50: q grows 7.25x per layer, ~1e258 at layer 300, no overflow
    # (needs the scaled Gram determinant: q1*q2 alone would overflow from q ~ 1e154 on)
    for general, qb0, alpha2, residual, expect in [(False, 1.0, 0.0, False, [0, 0, 1]),
                                                   (True, 3.0, 0.0, False, [0, 0, 1]),
                                                   (True, 3.0, 0.25, True, [0, 0, 0])]:
        args = (sw, sb, 1.0, qb0, 0.5, 1.0 + qb0 - 1.0, 300, store, alpha2, residual, general)
        (rows_a, status_a, last_a) = grid.run_compiled(codegen.load(K), *args)
        (rows_b, status_b, last_b) = grid.run_numpy(maps(K, method="quadrature"), *args)
        np.testing.assert_array_equal(status_a, status_b)
        np.testing.assert_array_equal(last_a, last_b)
        assert status_a.tolist() == expect
        for x, y in zip(rows_a, rows_b):   # q_aa, q_bb, q_ab, d
            if x.size:
                np.testing.assert_allclose(x, y, rtol=1e-13, equal_nan=True)


# table: builds tanh+max2 table panels, 295 s of CPU; 932 s of wall time on a shared machine (load ~10 on 2 cores)
@pytest.mark.parametrize("method", ["quadrature", pytest.param("table", marks=[pytest.mark.slow, pytest.mark.timeout(1800)])])
def test_tanh_max2_matches_the_mpmath_maps(method):
    """tanh + max2 (no closed form; order-statistic h_2 integrals): propagate's layers against the
    recursion of the mpmath maps sf.q_map / sf.qab_map at dps 20 (docs/theory.md section 4), to 1e-12."""
    import mpmath as mp
    act = sf.activation("tanh", pool="max", k=2)
    sw, sb, depth = 2.5, 0.1, 3
    r = sf.propagate(act, [sw], [sb], depth, method=method)
    with mp.workdps(30):
        q, qab = mp.mpf("2.5") + mp.mpf("0.1"), mp.mpf("0.1")          # layer 1 is linear
        for layer in range(2, depth + 1):
            q, qab = (sf.q_map(act, q, sw, sb, dps=20), sf.qab_map(act, q, q, qab, sw, sb, dps=20))
            assert abs(r.q[layer - 1, 0] - float(q)) <= 1e-12 * float(q)
            assert abs(r.qab[layer - 1, 0] - float(qab)) <= 1e-12 * float(q)
