"""dps= for the max-pool covariance maps C, dC of a non-monotone phi (levelsets.argmax_expect2_mp).

Oracles independent of that code path: exact values of abs+max2 (c = 0: products of mpmath.quad of the 1-D
defining integrals; c = 1: V = q (1 + 2/pi), dpsi2 = 1), the float64 level-set rule, seeded Monte Carlo of the
2k-dimensional definition.  The 2-D mpmath rule is slow (minutes), so its cases are marked slow."""
import warnings

import mpmath as mp
import numpy as np
import pytest

import symfield as sf


def nm(name, k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sf.activation(name, pool="max", k=k)


def mean_max_abs(q, dps):
    """E max(|u1|, |u2|) = int_0^inf (1 - (2 N(x/s) - 1)^2) dx, u_j ~ N(0, q) (mpmath.quad)."""
    with mp.workdps(dps):
        s = mp.sqrt(mp.mpf(q))
        return mp.quad(lambda x: 1 - (2 * mp.ncdf(x / s) - 1) ** 2, [0, s, 4 * s, mp.inf])


def test_abs_c0_exact():
    """c = 0: C = mean(q1) mean(q2), dC = E[sign(u_A)] E[sign(v_B)] / k = 0 (abs' = sign is odd, u_A symmetric)."""
    act = nm("abs", 2)
    got = sf.C(act, 0.75, 1.5, 0.0, dps=20)
    with mp.workdps(40):
        ref = mean_max_abs(0.75, 40) * mean_max_abs(1.5, 40)
        assert abs(got - ref) <= mp.mpf(10) ** -19 * ref
        assert abs(sf.map_value(act, "dC", 0.75, 1.5, 0.0, dps=20)) <= mp.mpf(10) ** -19


def test_abs_c1_exact():
    """c = 1, q1 = q2: C = V = q (1 + 2/pi), dC = dpsi2 = 1."""
    act = nm("abs", 2)
    with mp.workdps(40):
        assert abs(sf.C(act, 0.75, 0.75, 0.75, dps=20) - mp.mpf(0.75) * (1 + 2 / mp.pi)) <= mp.mpf(10) ** -19
        assert abs(sf.map_value(act, "dC", 0.75, 0.75, 0.75, dps=20) - 1) <= mp.mpf(10) ** -19


def test_refusals():
    act = nm("abs", 2)
    with pytest.raises(NotImplementedError, match=r"\|c\| = 1"):
        sf.C(act, 1.0, 4.0, -2.0, dps=20)


def mc(phi, dphi, k, q1, q2, c, n=10**6, seed=7):
    """Seeded Monte Carlo of C and dC from the 2k-dimensional definition: (mean, standard error) each."""
    rng = np.random.default_rng(seed)
    z1 = rng.standard_normal((n, k))
    z2 = c * z1 + np.sqrt(1 - c * c) * rng.standard_normal((n, k))
    u, v = np.sqrt(q1) * z1, np.sqrt(q2) * z2
    pu, pv = phi(u), phi(v)
    iu, iv = pu.argmax(axis=1), pv.argmax(axis=1)
    rows = np.arange(n)
    C = pu.max(axis=1) * pv.max(axis=1)
    dC = dphi(u[rows, iu]) * dphi(v[rows, iv]) * (iu == iv)
    return {m: (a.mean(), a.std() / np.sqrt(n)) for m, a in (("C", C), ("dC", dC))}


@pytest.mark.slow
@pytest.mark.parametrize("name,phi,dphi", [("abs", np.abs, np.sign)])
def test_two_dimensional_against_float64_and_monte_carlo(name, phi, dphi):
    """dps=10 at (q1, q2, c) = (1, 1, 0.5): float64 level-set rule to 1e-10 of the natural scale, Monte Carlo
    within 5 SE."""
    act = nm(name, 2)
    ref = mc(phi, dphi, 2, 1.0, 1.0, 0.5)
    for m, scale in (("C", sf.V(act, 1.0)), ("dC", sf.map_value(act, "dpsi2", 1.0))):
        got = float(sf.map_value(act, m, 1.0, 1.0, 0.5, dps=10))
        assert abs(got - float(sf.map_value(act, m, 1.0, 1.0, 0.5))) <= 1e-10 * scale, (m, got)
        est, se = ref[m]
        assert abs(got - est) <= 5 * se, (m, got, est, se)
