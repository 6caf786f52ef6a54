"""Certified 1-D tables (symfield/table1d.py): accuracy against mpmath, the disk cache, the range."""
import math

import numpy as np

import symfield as sf
from symfield.numeric import table1d
from symfield.symbolic.gaussian import q as Q
from symfield.symbolic.kernel import kernel
from symfield.numeric.evaluate import evaluator


def _table(tmp_path, monkeypatch, name="tanh"):
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    K = kernel(name)
    f = evaluator(K.V, (Q,), K.kinks)
    return K, f


def test_tanh_V_table_vs_mpmath_and_reload(tmp_path, monkeypatch):
    K, f = _table(tmp_path, monkeypatch)
    calls = []
    T = table1d.Table1D(lambda v: (calls.append(len(np.atleast_1d(v))), f(v))[1], key="test tanh V")
    assert calls and T.error < 1e-13
    qs = np.array([1e-11, 3.7e-6, 0.0123, 0.57, 1.0, 7.3, 913.0, 4.1e5, 9e11])
    got = T(qs)
    for qv, g in zip(qs, got):     # independent oracle: mpmath quadrature of E tanh(sqrt(q) z)^2 at dps 30
        ref = sf.V("tanh", float(qv), dps=30)
        assert abs(g - float(ref)) <= 1e-13 * float(ref), (qv, g, ref)
    files = list((tmp_path / "codegen" / "tables1d").glob("t1d_*.npz"))
    assert len(files) == 1
    calls.clear()
    T2 = table1d.Table1D(lambda v: (calls.append(1), f(v))[1], key="test tanh V")   # loaded: no evaluation
    assert not calls and np.array_equal(T2(qs), got) and T2.error == T.error
    T3 = table1d.Table1D(f, key="another key")                                        # another key: rebuilt
    assert len(list((tmp_path / "codegen" / "tables1d").glob("t1d_*.npz"))) == 2 and np.array_equal(T3(qs), got)


def test_outside_range_is_evaluated_directly_once_per_value(tmp_path, monkeypatch):
    K, f = _table(tmp_path, monkeypatch)
    T = table1d.Table1D(f, key="test tanh V range")
    seen = []
    T.f = lambda v: (seen.append(np.size(v)), f(v))[1]
    q = np.array([1e-13] * 1000 + [1e13] * 500 + [2.0])
    out = T(q)
    assert seen == [2]                                   # two distinct outside values, one call
    assert abs(out[0] - 1e-13) <= 1e-13 * 1e-12          # V(q) = q - 2 q^2 + ... for tanh
    assert abs(out[-1] - float(sf.V("tanh", 2.0, dps=20))) <= 1e-13


def test_corrupt_cache_file_is_rebuilt(tmp_path, monkeypatch):
    K, f = _table(tmp_path, monkeypatch)
    path = table1d._path("test corrupt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not an npz")
    T = table1d.Table1D(f, key="test corrupt")
    assert math.isclose(T(np.array([1.0]))[0], float(sf.V("tanh", 1.0, dps=20)), rel_tol=1e-13)
    with np.load(path) as z:
        assert z["coef"].shape[1] == table1d.N


def test_the_last_panel_serves_its_right_end():
    """q = 2^P_HI (where the EOC bracket stops growing) is the last panel's end: served by the table (its
    Chebyshev sum at x = 1), not by a new direct evaluation; equal to the evaluator there to the table's bound."""
    import numpy as np   # noqa: PLC0415
    from symfield.numeric import table1d   # noqa: PLC0415
    calls = []

    def f(q):
        calls.append(np.size(q))
        return np.tanh(np.log1p(np.asarray(q, float)))
    T = table1d.Table1D(f)
    calls.clear()
    top = 2.0 ** T.hi[-1]
    got = T(np.array([top]))
    assert calls == [] and abs(got[0] - f(top)) <= 1e-12
