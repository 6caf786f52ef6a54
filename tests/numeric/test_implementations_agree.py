"""Every remaining implementation of a map, held against the others (docs/numerics.md section 1).

The maps engine keeps one implementation per number context, and a few forms of the same function that
exist for speed or because code runs in two places:

- closed forms: the lambdified SymPy expression (NumPy) and the printed, compiled one (generated module);
- tables: the table maps compiled (with printed, unrolled Chebyshev sums) and the same functions run as
  plain Python (Clenshaw loops), against the defining integral (quadrature) within the table's certified
  bound;
- every float64 value against mpmath at 30 digits (an independent evaluation of the defining integral or
  closed form);
- the recursion: the compiled grid kernel against the same kernel run as plain Python.
"""
import numpy as np
import pytest

import symfield as sf
from symfield.numeric import codegen, grid, tables
from symfield.numeric.kernels import table_maps
from symfield.numeric.maps import maps

RNG = np.random.default_rng(20261205)
Q1 = np.exp(RNG.uniform(np.log(0.3), np.log(3.0), 12))
C12 = RNG.uniform(-0.95, 0.999, 12)


def _points(equal):
    q2 = Q1 if equal else Q1 * np.exp(RNG.uniform(-0.5, 0.5, Q1.size))
    return Q1, q2, C12 * np.sqrt(Q1 * q2)


def _mp(K, name, *args):
    M = maps(K, 30)
    return np.array([float(getattr(M, name)(*a)) for a in zip(*args)])


@pytest.mark.parametrize("act", ["relu", "erf", "leaky_relu", "cos"])
def test_closed_forms_lambdified_compiled_and_mpmath_agree(act):
    K = sf.kernel(act)
    mod = codegen.load(K)
    a, b, c = _points(equal=False)
    d = a + b - 2 * c
    M = maps(K)
    scale = np.sqrt(M.V(a) * M.V(b))
    for name, args in (("V", (a,)), ("C", (a, b, c)), ("D", (a, b, c, d))):
        compiled = np.array([getattr(mod, name)(codegen.no_data(), *map(float, x)) for x in zip(*args)])
        numpy_ = getattr(M, name)(*args)
        exact = _mp(K, name, *args)
        assert np.max(np.abs(compiled - exact) / scale) <= 1e-13, name
        assert np.max(np.abs(numpy_ - exact) / scale) <= 1e-13, name


@pytest.mark.parametrize("n_mp", [4, pytest.param(Q1.size, marks=pytest.mark.slow)])   # dps-30 checks: minutes
@pytest.mark.parametrize("spec", ["tanh", pytest.param("relu+max2", marks=pytest.mark.slow),   # pools: 30-60 s each
                                  pytest.param("tanh+avg2", marks=pytest.mark.slow)])
def test_table_compiled_python_quadrature_and_mpmath_agree(spec, n_mp):
    name, _, pool = spec.partition("+")
    act = sf.activation(name, pool=pool[:3], k=int(pool[3:])) if pool else sf.activation(name)
    K = sf.kernel(act)
    T = tables.table(K, 0.25, 3.5)
    equal = T.kind != "homogeneous"
    a, b, c = _points(equal)
    d = a + b - 2 * c
    M, Mq = T.arrays(), maps(K, method="quadrature")
    mod = codegen.table_module()
    scale = np.sqrt(Mq.V(a) * Mq.V(b))
    bound = max(v for v in T.error.values() if np.isfinite(v)) + 1e-12     # certified, in the natural scale
    for what, args in (("V", (a,)), ("C", (a, b, c)), ("D", (a, b, c, d))):
        compiled = getattr(mod, f"{what}_many")(M, *(np.ascontiguousarray(x) for x in args))
        python = np.array([getattr(table_maps, what)(M, *map(float, x)) for x in zip(*args)])
        quad = getattr(Mq, what)(*args)
        np.testing.assert_allclose(python, compiled, rtol=0, atol=1e-15 * np.max(np.abs(compiled)))
        assert np.max(np.abs(compiled - quad) / scale) <= bound, what
        if what != "C" or K.act.pool != "max":          # no mpmath path for max-pool covariances
            exact = _mp(K, what, *(x[:n_mp] for x in args))
            assert np.max(np.abs(compiled[:n_mp] - exact) / scale[:n_mp]) <= bound, what


def test_compiled_and_python_grid_kernels_agree():
    """The grid kernel of kernels.recursion, compiled over the tanh table and run as plain Python over the
    same table maps: the same layers, the same statuses (a point leaving the table stops in both)."""
    K = sf.kernel("tanh")
    full = tables.table(K, 0.25, 3.5)
    T = tables.Table(K)                                    # the panels over [1/4, 4) only
    T.panels.update({p: full.panels[p] for p in range(tables.panel_of(0.25), tables.panel_of(3.5) + 1)})
    sw, sb = np.array([0.6, 1.5, 2.5, 30.0]), np.array([0.05, 0.1, 0.0, 0.2])
    depth, store = 6, np.arange(1, 7, dtype=np.int64)
    runs = []
    for recurse in (codegen.table_module().recurse,
                    grid.python_recursion(table_maps.V, table_maps.C, table_maps.D, table_maps.in_domain)):
        out, status, last = grid.outputs(store.size, sw.size, False, depth)
        start, st = np.ones(sw.size, dtype=np.int64), grid._state(sw.size)
        recurse(sw, sb, 1.0, 1.0, 0.0, 2.0, depth, depth, store, 0.0, False, False, T.arrays(), 0, grid.NO_AUX,
                T.arrays(), False, start, *st, *out, status, last)
        runs.append((out, status, last))
    (oa, sa, la), (ob, sb_, lb) = runs
    np.testing.assert_array_equal(sa, sb_)
    np.testing.assert_array_equal(la, lb)
    assert sa[-1] == 4 and sa[2] == 0                      # sigma_w2 = 30 leaves the table: LEFT_TABLE in both
    for x, y in zip(oa, ob):
        np.testing.assert_allclose(x, y, rtol=1e-14, equal_nan=True)
