"""The table's NumPy lookups (symfield.numeric.tables.lookup) against the per-point table maps the compiled
recursion runs (table_maps, here as plain Python), and against the defining integral.

The two evaluate the same certified table (same panel, same cell, same coefficients) and differ only in how the
Chebyshev sum is added up: T_i(x) a_ij T_j(y) against Clenshaw's recurrence. So they agree to rounding, relative
to the kernel's scale sqrt(V(q1) V(q2)), at points inside and outside the table (NaN at the same points), at
unequal norms, at c next to +-1 and at q = 0."""
import numpy as np
import pytest

import symfield as sf
from symfield.numeric import tables
from symfield.numeric.kernels import table_maps
from symfield.numeric.maps import maps
from symfield.numeric.tables import lookup


def _points(rng, n=2500):
    q1 = np.exp(rng.uniform(np.log(0.01), np.log(60.0), n))
    eq = rng.random(n) < 0.6
    q2 = np.where(eq, q1, q1 * np.exp(rng.uniform(-0.7, 0.7, n)))
    c = np.concatenate([rng.uniform(-1, 1, n - 600), 1 - 10 ** rng.uniform(-16, -1, 300),
                        -1 + 10 ** rng.uniform(-16, -1, 300)])
    rng.shuffle(c)
    q1[:5], q2[:5] = 0.0, 0.0               # q = 0: C = psi(0)^2, D = 0
    q12 = c * np.sqrt(q1 * q2)
    d = np.where(eq, 2 * q1 * (1 - c), q1 + q2 - 2 * q12)
    return q1, q2, q12, d


@pytest.mark.parametrize("spec", ["tanh", "gelu", "relu+max2", "x*erf(x)"])
def test_numpy_lookups_match_the_compiled_maps_per_point(spec):
    name, _, pool = spec.partition("+")
    act = sf.activation(name, pool=pool[:3], k=int(pool[3:])) if pool else sf.activation(name)
    T = tables.table(sf.kernel(act), 0.25, 3.5)
    M = T.arrays()
    q1, q2, q12, d = _points(np.random.default_rng(7))
    V1 = np.array([table_maps.V(M, float(q)) for q in q1])
    V2 = np.array([table_maps.V(M, float(q)) for q in q2])
    scale = np.sqrt(np.abs(V1 * V2)) + 1e-300
    scale[np.isnan(scale)] = 1.0                  # q = 0 below the table's first panel: C = psi(0)^2 = 0 there
    for what, args in (("V", (q1,)), ("C", (q1, q2, q12)), ("D", (q1, q2, q12, d))):
        ref = np.array([getattr(table_maps, what)(M, *map(float, a)) for a in zip(*args)])
        got = getattr(lookup, what)(M, *args)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=what)
        ok = ~np.isnan(ref)
        assert ok.sum() > 400, what               # (q in [0.25, 4] for both norms: a fifth or more of the points)
        err = np.abs(got[ok] - ref[ok]) / (scale[ok] if what != "V" else np.abs(ref[ok]) + 1e-300)
        assert err.max() <= 4e-15, (what, float(err.max()))


def test_engine_lookups_without_numba_match_the_integral():
    """A phase diagram's C and D come from the NumPy lookups (no compiled module loaded): within the table's
    certified 1e-12 of the defining integral (quadrature at 30 digits)."""
    K = sf.kernel("tanh")
    M = maps(K)
    q = np.array([0.3, 1.0, 2.5])
    c = np.array([-0.6, 0.4, 0.999])
    got_C = M.C_eq(q, c)
    got_D = M.D(q, q, c * q, 2 * q * (1 - c))
    mp = maps(K, 30)
    for i in range(q.size):
        ref_C = float(mp.C(q[i], q[i], c[i] * q[i]))
        ref_D = float(mp.D(q[i], q[i], c[i] * q[i], 2 * q[i] * (1 - c[i])))
        scale = float(mp.V(q[i]))
        assert abs(got_C[i] - ref_C) <= 1e-12 * scale
        assert abs(got_D[i] - ref_D) <= 1e-12 * abs(ref_D) + 1e-15 * scale
