"""LayerNorm on the compiled grid recursion (docs/theory.md section 12.4) against the layer-by-layer NumPy path
("numpy-norm") and against oracles written here: the arc-cosine kernel of relu in mpmath at 30 digits, and for
tanh and gelu the Gaussian integrals by the trapezoid rule on a fine grid (exponentially convergent for these
analytic integrands; nested mpmath.quad takes minutes per point)."""
import math

import mpmath
import numpy as np
import pytest

import symfield as sf
from symfield.symbolic.kernel import kernel
from symfield.theory import norm as nm
from symfield.theory import propagate as P

SW, SB = np.array([0.7, 1.5, 2.5]), np.array([0.0, 0.1, 0.05])
DEPTH, QAB0 = 5, 0.3
H = 0.04
Z = np.arange(-12, 12 + H / 2, H)
WZ = H * np.exp(-Z**2 / 2) / math.sqrt(2 * math.pi)
PHI = {"tanh": np.tanh, "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))}


def _trap_maps(f, q, c):
    """(E psi, V, C) at variance q and correlation c by the 2-D trapezoid rule over independent normals."""
    r = math.sqrt(q)
    fu = f(r * Z)
    inner = f(r * (c * Z[:, None] + math.sqrt(1 - c * c) * Z[None, :])) @ WZ
    return WZ @ fu, WZ @ fu**2, WZ @ (fu * inner)


def _relu_maps(q, c):
    """(E relu, V, C) in mpmath (arc-cosine kernel)."""
    c = max(min(c, mpmath.mpf(1)), mpmath.mpf(-1))
    return (mpmath.sqrt(q / (2 * mpmath.pi)), q / 2,
            q * (mpmath.sqrt(1 - c * c) + (mpmath.pi - mpmath.acos(c)) * c) / (2 * mpmath.pi))


def oracle(act, at, sw, sb):
    """(q, qab) per layer of the LayerNorm recursion, equal norms q0 = 1, qab0 = 0.3, from the maps above."""
    with mpmath.workdps(30):
        if act == "relu":
            sw, sb, maps = mpmath.mpf(sw), mpmath.mpf(sb), _relu_maps
        else:
            def maps(q, c):
                return _trap_maps(PHI[act], float(q), float(c))
        q, qab = sw + sb, QAB0 * sw + sb
        out = [(q, qab)]
        for _ in range(DEPTH - 1):
            if at == "before":
                _, V1, C = maps(1, qab / q)
                q, qab = sw * V1 + sb, sw * C + sb
            else:
                m, V, C = maps(q, qab / q)
                q, qab = sw + sb, sw * (C - m * m) / (V - m * m) + sb
            out.append((q, qab))
        return np.array([[float(a), float(b)] for a, b in out])


def numpy_norm(act, at, sw, sb, **kw):
    """The layer-by-layer NumPy path (norm.recursion), called directly."""
    qb0 = kw.get("qbb0", 1.0)
    return P._layerwise(kernel(act), nm.options("t", "layer", at), sw.astype(float), sb.astype(float), sw.shape,
                        1.0, qb0, QAB0, 1.0 + qb0 - 2 * QAB0, DEPTH, np.arange(1, DEPTH + 1), None, None)


@pytest.mark.parametrize("act", ["relu", "tanh", "gelu"])
@pytest.mark.parametrize("at", ["before", "after"])
def test_layernorm_compiled_against_numpy_and_oracle(act, at):
    p = sf.propagate(act, SW, SB, depth=DEPTH, qab0=QAB0, norm="layer", norm_at=at)
    assert p.method in ("numba-generated", "numba-table") and p.params["norm"] == "layer"
    assert p.params["norm_at"] == at and (p.status == 0).all()
    ref = numpy_norm(act, at, SW, SB)
    assert ref.method == "numpy-norm"
    for n in ("q", "d"):
        np.testing.assert_allclose(getattr(p, n), getattr(ref, n), rtol=1e-13)
    np.testing.assert_allclose(p.qab, ref.qab, rtol=1e-13, atol=1e-14 * p.q.max())
    for i, (sw, sb) in enumerate(zip(SW, SB)):
        o = oracle(act, at, sw, sb)
        np.testing.assert_allclose(p.q[:, i], o[:, 0], rtol=1e-12)
        np.testing.assert_allclose(p.qab[:, i], o[:, 1], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(p.d[:, i], 2 * (o[:, 0] - o[:, 1]), rtol=1e-11)


def test_layernorm_before_with_unequal_input_norms_compiled():
    """LayerNorm before phi rescales each sample to variance 1, so unequal input norms run compiled too."""
    p = sf.propagate("tanh", SW, SB, depth=DEPTH, qab0=QAB0, qbb0=2.0, norm="layer")
    ref = numpy_norm("tanh", "before", SW, SB, qbb0=2.0)
    assert p.method == "numba-table" and p.qbb is not None
    for n in ("q", "qab", "d", "one_minus_c"):
        np.testing.assert_allclose(getattr(p, n), getattr(ref, n), rtol=1e-13)


def test_layernorm_keeps_one_minus_c_near_one_compiled():
    """d carried by its map: inputs at 1 - c = 1e-12 keep 1 - c to float64's relative accuracy, as numpy-norm."""
    for at in ("before", "after"):
        p = sf.propagate("relu", 2.0, 0.1, depth=6, q0=1.0, qab0=1.0, d0=2e-12, norm="layer", norm_at=at)
        ref = sf.propagate("relu", 2.0, 0.1, depth=6, q0=1.0, qab0=1.0, d0=2e-12, norm="layer", norm_at=at, dps=30)
        assert p.method == "numba-generated"
        np.testing.assert_allclose(p.one_minus_c, np.asarray(ref.one_minus_c, float), rtol=1e-12)


def test_paths_the_engine_keeps_in_numpy():
    assert sf.propagate("relu", 2.0, 0.1, depth=4, norm="batch", batch=8).method == "numpy-norm"
    p = sf.propagate("relu", 2.0, 0.1, depth=4, qbb0=2.0, norm="layer", norm_at="after")
    assert p.method == "numpy-norm"
    with pytest.raises(sf.SymfieldError, match="'residual' parameter of propagate"):
        sf.propagate("relu", 2.0, 0.1, depth=4, residual=0.5, norm="layer")


@pytest.mark.parametrize("at", ["before", "after"])
def test_vectorised_c_star_matches_the_fixed_point_by_iteration(at):
    """normed_phases solves c* at all points at once; the oracle iterates the c-map (a contraction there) itself."""
    K, o = kernel("tanh"), nm.options("t", "layer", at)
    sw, sb = np.array([0.8, 1.5, 3.0]), np.array([0.1, 0.2, 0.05])
    cs = nm.normed_phases(K, o, sw, sb)[1]
    c = sb / (sw + sb)
    for _ in range(3000):
        c = nm.c_next(K, o, sw, sb, c)
    np.testing.assert_allclose(cs, c, rtol=1e-11)
    assert nm.ln_c_star(K, o, 1.5, 0.2) == pytest.approx(cs[1], rel=1e-14)
