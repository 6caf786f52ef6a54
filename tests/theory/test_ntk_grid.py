"""propagate(..., ntk=True): the NTK carried by the compiled grid recursion (closed forms) and the NumPy path of
tabulated kernels, against oracles that share no code with it: sf.ntk at dps=30 (mpmath), and the NTK recursion
written here with relu's arc-cosine and erf's closed-form maps in mpmath at many digits (docs/theory.md section 13)."""
import mpmath as mp
import numpy as np
import pytest

import symfield as sf
from symfield.numeric import grid
from symfield.symbolic.activation import activation


def _relu(q, c):
    """V, C, E[psi'^2], dC/dq12 of relu at equal norms q and covariance c (arc-cosine kernels)."""
    th = mp.acos(max(min(c / q, 1), -1))
    return q / 2, q / (2 * mp.pi) * (mp.sin(th) + (mp.pi - th) * mp.cos(th)), mp.mpf(1) / 2, (mp.pi - th) / (2 * mp.pi)


def _erf(q, c):
    A = 1 + 2 * q
    return (2 / mp.pi * mp.asin(2 * q / A), 2 / mp.pi * mp.asin(2 * c / A),
            4 / mp.pi / mp.sqrt(A * A - 4 * q * q), 4 / mp.pi / mp.sqrt(A * A - 4 * c * c))


def _oracle(maps, sw, sb, depth, q0, qab0, dps, alpha=None):
    """(Theta_aa, Theta_ab, d_Theta = 2 (Theta_aa - Theta_ab)) per layer by the plain recursion at ``dps`` digits
    (enough digits that the differences keep 15)."""
    with mp.workdps(dps):
        sw, sb, g = mp.mpf(sw), mp.mpf(sb), (1 if alpha is None else mp.mpf(alpha) ** 2)
        s = 0 if alpha is None else 1
        q, c = sw * mp.mpf(q0) + sb, sw * mp.mpf(qab0) + sb
        ta, tb, out = q, c, []
        for _ in range(depth):
            out.append((ta, tb, 2 * (ta - tb)))
            V, C, P, T = maps(q, c)
            ta = (s + g * sw * P) * ta + g * (sw * V + sb)
            tb = (s + g * sw * T) * tb + g * (sw * C + sb)
            q, c = s * q + g * (sw * V + sb), s * c + g * (sw * C + sb)
        return [tuple(float(v) for v in row) for row in out]


def _check(P, i, j, ref, layers, rtol):
    for k, L in enumerate(layers):
        for got, want in zip((P.theta_aa, P.theta_ab, P.d_theta), ref[L - 1]):
            assert got[k, i, j] == pytest.approx(want, rel=rtol), (i, j, L)


@pytest.mark.parametrize("act", ["relu", "erf", activation("relu", pool="avg", k=2)])
def test_compiled_grid_against_sf_ntk_at_dps30(act):
    """The compiled NTK rows at grid points against sf.ntk in mpmath (30 digits): every stored layer to 1e-13."""
    sw, sb, layers = np.array([0.8, 1.9, 3.0]), np.array([0.0, 0.15]), [1, 2, 6]
    P = sf.propagate(act, sw[:, None], sb[None, :], 6, qab0=0.3, layers=layers, ntk=True)
    assert P.method == "numba-generated" and P.params["ntk"].startswith("compiled")
    for i, j in [(0, 1), (1, 0), (2, 1)]:
        r = sf.ntk(act, float(sw[i]), float(sb[j]), 6, qab0=0.3, dps=30)
        ref = [(float(a), float(b), float(2 * (a - b))) for a, b in zip(r.theta_aa, r.theta_ab)]
        _check(P, i, j, ref, layers, 1e-13)


@pytest.mark.parametrize("act,maps,points,depth", [
    ("relu", _relu, [(1.0, 0.1), (1.5, 0.1)], 120),       # gamma_Theta 7.6e17 and 1.5e7 at layer 120
    ("erf", _erf, [(0.8, 0.05), (1.0, 0.05)], 300),       # gamma_Theta 1.5e33 and 6.6e16 at layer 300
])
def test_d_theta_deep_ordered_against_closed_forms(act, maps, points, depth):
    """Deep in the ordered phase d_Theta = 2 (Theta_aa - Theta_ab) is a difference of nearly equal numbers; the
    compiled recursion carries it without cancellation (D, and dTdot by the distance map of phi' or Price's theorem):
    d_Theta and gamma_Theta against the plain closed-form recursion at 60 digits, to 1e-11 (a plain float64
    difference would have no correct digit left at gamma_Theta > 1e16)."""
    sw, sb = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    layers = [2, depth // 2, depth]
    P = sf.propagate(act, sw, sb, depth, qab0=0.5, layers=layers, ntk=True)
    assert P.params["ntk_exact"] and (P.status == 0).all()
    for i, (w, b) in enumerate(points):
        ref = _oracle(maps, w, b, depth, 1, "0.5", 60)
        for k, L in enumerate(layers):
            assert P.d_theta[k, i] == pytest.approx(ref[L - 1][2], rel=1e-11), (w, b, L)
            assert P.gamma_theta[k, i] == pytest.approx(2 * ref[L - 1][1] / ref[L - 1][2], rel=1e-11), (w, b, L)
    assert P.gamma_theta[-1].min() > 1e6


def test_compiled_residual_against_closed_forms():
    """Residual blocks: Theta' = (1 + alpha^2 sigma_w2 Tdot) Theta + alpha^2 (sigma_w2 T + sigma_b2)."""
    sw, sb = np.array([1.0, 2.5]), np.array([0.0, 0.1])
    P = sf.propagate("relu", sw[:, None], sb[None, :], 10, qab0=0.2, layers=[3, 10], residual=0.5, ntk=True)
    assert P.method == "numba-generated"
    for i in range(2):
        for j in range(2):
            _check(P, i, j, _oracle(_relu, sw[i], sb[j], 10, 1, "0.2", 40, alpha="0.5"), [3, 10], 1e-13)


def test_chunked_run_is_bit_identical(monkeypatch):
    """Ctrl-C chunks carry the NTK state: a run in many compiled calls equals one call bit for bit."""
    sw, sb = np.linspace(0.5, 3.0, 7)[:, None], np.array([0.0, 0.1, 0.2])
    one = sf.propagate("erf", sw, sb, 40, layers=[5, 17, 40], ntk=True)
    monkeypatch.setattr(grid, "CHUNK_WORK", 21.0)        # one layer per chunk at first
    monkeypatch.setattr(grid, "_next_chunk", lambda chunk, per_layer: 3)
    many = sf.propagate("erf", sw, sb, 40, layers=[5, 17, 40], ntk=True)
    for name in ("q", "qab", "d", "theta_aa", "theta_ab", "d_theta"):
        np.testing.assert_array_equal(getattr(one, name), getattr(many, name))
    np.testing.assert_array_equal(one.status, many.status)


def test_non_finite_theta_is_a_status():
    """A Theta that overflows stops its point with a non-zero status (never a silent inf): relu at huge sigma_w2,
    where Theta_aa ~ l q overflows a few layers before q does."""
    P = sf.propagate("relu", np.array([1e9, 1e10, 2.0]), 0.0, 60, ntk=True)
    assert P.status.tolist()[:2] == [1, 1] and P.status[2] == 0
    for i in range(3):
        bad = ~(np.isfinite(P.theta_aa[:, i]) & np.isfinite(P.theta_ab[:, i]) & np.isfinite(P.d_theta[:, i]))
        assert not bad.any() or P.status[i] != 0
        last = P.last_finite[i]
        assert np.isfinite(P.theta_aa[:last, i]).all()


def test_table_kernel_keeps_numpy_ntk_and_says_so():
    """tanh (a table: no compiled derivative maps) runs the NTK's maps in NumPy, named in method; its rows agree
    with sf.ntk (float64) at a grid point."""
    P = sf.propagate("tanh", np.array([[1.2], [1.8]]), np.array([0.05]), 8, qab0=0.2, layers=[2, 8], ntk=True)
    assert P.method.endswith("+numpy-ntk") and P.params["ntk"].startswith("NumPy")
    r = sf.ntk("tanh", 1.8, 0.05, 8, qab0=0.2, layers=[2, 8])
    np.testing.assert_allclose(P.theta_aa[:, 1, 0], np.asarray(r.theta_aa, float), rtol=1e-13)
    np.testing.assert_allclose(P.theta_ab[:, 1, 0], np.asarray(r.theta_ab, float), rtol=1e-13)
