"""The compiled grid recursion of closed forms runs a block of points as loops without branches (one per branch of the
maps' formulas that a point of the block takes, kept where it applies; numeric/kernels/recursion._block_layer). Blocks
here mix every case it must keep apart -- points on both sides of c = 1/2, on different branches of the NTK's maps,
points that stop (overflow) while the others go on -- and every point is checked against the recursion written out in
mpmath with the closed-form maps (40 digits)."""
import mpmath as mp
import numpy as np
import pytest

import symfield as sf


def _erf(q, c):
    """V, C, E[psi'^2], dC/dq12 of erf at equal norms q and covariance c."""
    A = 1 + 2 * q
    return (2 / mp.pi * mp.asin(2 * q / A), 2 / mp.pi * mp.asin(2 * c / A),
            4 / mp.pi / mp.sqrt(A * A - 4 * q * q), 4 / mp.pi / mp.sqrt(A * A - 4 * c * c))


def _relu(q, c):
    th = mp.acos(max(min(c / q, 1), -1))
    return q / 2, q / (2 * mp.pi) * (mp.sin(th) + (mp.pi - th) * mp.cos(th)), mp.mpf(1) / 2, (mp.pi - th) / (2 * mp.pi)


def _rows(maps, sw, sb, depth, qab0, alpha=None):
    """(q, q12, d, Theta_aa, Theta_ab) per layer, q0 = 1 (NTK parameterisation; residual alpha)."""
    with mp.workdps(40):
        sw, sb = mp.mpf(float(sw)), mp.mpf(float(sb))
        g, s = (1, 0) if alpha is None else (mp.mpf(alpha) ** 2, 1)
        q, c = sw + sb, sw * mp.mpf(qab0) + sb
        ta, tb, out = q, c, []
        for _ in range(depth):
            out.append((q, c, 2 * (q - c), ta, tb))
            V, C, P, T = maps(q, c)
            ta, tb = (s + g * sw * P) * ta + g * (sw * V + sb), (s + g * sw * T) * tb + g * (sw * C + sb)
            q, c = s * q + g * (sw * V + sb), s * c + g * (sw * C + sb)
        return out


def _compare(P, maps, sw, sb, depth, qab0, layers, ntk, alpha=None, rtol=1e-12):
    names = ("q", "qab", "d") + (("theta_aa", "theta_ab") if ntk else ())
    for i in range(sw.size):
        for j in range(sb.size):
            if P.status[i, j] != 0:
                continue
            ref = _rows(maps, sw[i], sb[j], depth, qab0, alpha)
            for k, L in enumerate(layers):
                for name, want in zip(names, ref[L - 1]):
                    got = getattr(P, name)[k, i, j]
                    assert got == pytest.approx(float(want), rel=rtol, abs=1e-300), (name, sw[i], sb[j], L)


@pytest.mark.parametrize("ntk", [False, True])
@pytest.mark.parametrize("qab0", [0.9, 0.2])
def test_erf_blocks_across_branches(ntk, qab0):
    """erf over 7 x 5 points (blocks of 16 that straddle c = 1/2, the ordered and chaotic phases and, with the NTK,
    Price's theorem with 3 and 8 points, the printed T, the pair (C, T)): every point, every stored layer."""
    sw, sb = np.array([0.3, 0.9, 1.4, 2.0, 2.7, 3.5, 4.0]), np.array([0.0, 0.02, 0.08, 0.2, 0.6])
    layers, depth = [2, 3, 7, 16, 30], 30
    P = sf.propagate("erf", sw[:, None], sb[None, :], depth, qab0=qab0, layers=layers, ntk=ntk)
    assert P.method == "numba-generated" and (P.status == 0).all()
    c = P.qab / P.q
    assert (c > 0.5).any() and (c < 0.5).any()          # both sides of c = 1/2 in the run
    _compare(P, _erf, sw, sb, depth, qab0, layers, ntk)


@pytest.mark.parametrize("ntk", [False, True])
def test_residual_blocks(ntk):
    sw, sb = np.array([0.5, 1.5, 3.0]), np.array([0.0, 0.1, 0.3])
    P = sf.propagate("erf", sw[:, None], sb[None, :], 12, qab0=0.4, layers=[2, 12], residual=0.7, ntk=ntk)
    _compare(P, _erf, sw, sb, 12, 0.4, [2, 12], ntk, alpha="0.7")


@pytest.mark.parametrize("ntk", [False, True])
def test_points_that_stop_leave_their_block_running(ntk):
    """relu with sigma_w2 = 1e9 beside ordinary points in one block: the huge ones overflow (status 1, later rows NaN)
    while their neighbours run on, each as by itself."""
    sw = np.array([2.0, 1e9, 1.5, 3e9, 0.5, 2.5, 1e10, 1.0])
    sb = np.array([0.0, 0.1])
    P = sf.propagate("relu", sw[:, None], sb[None, :], 40, qab0=0.3, layers=[5, 40], ntk=ntk)
    huge = sw > 1e6
    assert (P.status[huge] == 1).all() and (P.status[~huge] == 0).all()
    assert np.isnan(P.q[-1][huge]).all()
    _compare(P, _relu, sw, sb, 40, 0.3, [5, 40], ntk)
