"""Growing a table while propagating: every round makes progress or stops (issue 27).

The livelock this guards against: a table's packed arrays M (what the compiled lookup reads) were packed
during a build (by its mpmath checks), and then ``save`` merged panels that another Table object of the same
kernel had written to disk. The table then claimed q's panel while M lacked it: the point left M, ``ensure``
found nothing to build, and propagate's "extend, then try again" loop repeated for ever.

Each test builds its state in this process, in any order: two Table objects of tanh on a temporary
SYMFIELD_CACHE (tables) and an empty table registry. Panels are built once per module (real builds, q in
[1/8, 1)); the tests hand them to ``ensure`` through its panel builder, so ensure runs as in a real build
(acceptance, mpmath checks, save with merge). Oracles: mpmath quadrature of V for q (sf.q_map at dps 15) and
propagate's quadrature path (a different evaluation of the same recursion) for q12.
"""
import re
import warnings

import numpy as np
import pytest

import symfield as sf
from symfield.core.files import CacheWarning
from symfield.numeric import codegen, tables
from symfield.numeric.kernels import layout, recursion, table_maps
from symfield.theory import propagate as P

K = sf.kernel("tanh")
SW, SB, Q0, QAB0, DEPTH = 1.0, 0.0, 0.4, 0.3, 4   # q: 0.4 (panel 7), 0.239, 0.168, 0.129 (panel 6)
ROUNDS = tables.Q_CAP_EXP - tables.E0 + 2        # more rounds than a table has panels: no progress


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Panels 6, 7, 8 of tanh (q in [1/8, 1)), built once in a module-private cache."""
    codegen.table_module()     # compiled under the session's cache, not again in each temporary one
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setenv("SYMFIELD_CACHE", str(tmp_path_factory.mktemp("built")))
        mp_.setenv("SYMFIELD_SHIPPED", "0")
        mp_.setattr(tables.build, "MP_CHECKS", 0)
        T = tables.Table(K)
        T.ensure(0.13, 0.99)
    assert sorted(T.panels) == [6, 7, 8]
    return T.panels


@pytest.fixture
def cache(fresh_caches, monkeypatch, tmp_path, built):
    """An empty temporary cache and table registry; Table.ensure 'builds' the module's panels."""
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    monkeypatch.setenv("SYMFIELD_SHIPPED", "0")
    monkeypatch.setattr(tables, "_TABLES", {})
    monkeypatch.setattr(tables.Table, "_build_panel", lambda self, ev, p: built[p])
    return tmp_path


@pytest.fixture
def bounded(monkeypatch):
    """Table extensions during one propagate are counted; more than ROUNDS fails the test instead of hanging."""
    calls = []
    extend = tables.Table.extend_to

    def counted(T, lo, hi):
        calls.append((lo, hi))
        assert len(calls) <= ROUNDS, f"no progress: {len(calls)} extensions of the table, the last {calls[-1]}"
        return extend(T, lo, hi)
    monkeypatch.setattr(tables.Table, "extend_to", counted)
    return calls


def covers(M, q):
    """Where the packed table M evaluates the step (the table maps' in_domain, run as plain Python)."""
    return np.array([table_maps.in_domain(M, x, x, 0.0) for x in np.atleast_1d(q)])


def _propagate(method):
    return sf.propagate("tanh", SW, SB, DEPTH, q0=Q0, qab0=QAB0, method=method)


def _check(r):
    """q against mpmath (sf.q_map, dps 15), q12 against the quadrature path; status 0."""
    assert r.status.tolist() == 0
    q = Q0 * SW + SB
    for layer in range(1, DEPTH + 1):
        assert abs(r.q[layer - 1] - q) <= 1e-13 * q, layer
        q = float(sf.q_map("tanh", q, SW, SB, dps=15))
    ref = _propagate("quadrature")
    np.testing.assert_allclose(r.qab, ref.qab, rtol=1e-13)


def test_panels_merged_from_disk_after_packing_reach_the_compiled_lookup(cache, bounded, monkeypatch):
    """The hang of issue 27, in one process: A writes panel 6 to disk; B builds panel 7, packs M in its mpmath
    check, then merges panel 6 from disk while saving. Propagating from q = 0.4 down into panel 6 with B
    must use panel 6 (old code: M lacked it, ensure built nothing, the loop never ended)."""
    monkeypatch.setattr(tables.build, "MP_CHECKS", 0)
    A = tables.Table(K)
    assert A.ensure(0.15, 0.15) == 1                     # panel 6, saved
    monkeypatch.setattr(tables.build, "MP_CHECKS", 1)    # the check that packed M before the merge
    B = tables.Table(K)
    assert B.ensure(0.3, 0.3) == 1 and sorted(B.panels) == [6, 7]   # built 7, merged 6
    tables._TABLES[tables.key(K)] = B
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # a consistent table: no quadrature fallback
        r = _propagate("table")
    assert r.method == "numba-table" and len(bounded) == 1 and sorted(B.panels) == [6, 7]   # the first guess only
    _check(r)
    M = B.arrays()
    assert covers(M, [0.125, 0.2, 0.49]).all() and not covers(M, [0.124, 0.5]).any()
    np.testing.assert_array_equal(M, tables.pack(B))


def test_packed_arrays_follow_every_panel_change(cache, built):
    """arrays() is re-packed after a panel is added, replaced or removed by any route, and only then."""
    T = tables.Table(K)
    T.panels[7] = built[7]
    M7 = T.arrays()
    assert T.arrays() is M7 and not covers(M7, 0.2)
    T.panels[6] = built[6]                                # added directly, as a caller might
    M67 = T.arrays()
    assert covers(M67, 0.2) and np.array_equal(M67, tables.pack(T), equal_nan=True)
    T.panels[6] = tables.Panel(built[6].vcoef * 2.0, built[6].cells, built[6].err, built[6].rcells)
    assert not np.array_equal(T.arrays(), M67, equal_nan=True)   # replaced: new coefficients packed
    del T.panels[6]
    np.testing.assert_array_equal(T.arrays(), M7)


def test_merge_from_disk_keeps_the_panels_contiguous(cache, monkeypatch):
    """save merges only panels that extend the table contiguously: disk {6}, built {8} -> {8} (the file stays
    readable: a gap would be refused by check_structure and the compiled lookup); disk {6, 7} -> {6, 7, 8}."""
    monkeypatch.setattr(tables.build, "MP_CHECKS", 0)
    A = tables.Table(K)
    A.ensure(0.15, 0.15)
    B = tables.Table(K)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)      # nothing is quarantined
        B.ensure(0.6, 0.6)
        assert sorted(B.panels) == [8] and sorted(tables.read(tables.store.path_of(K), K, tables.Table).panels) == [8]
    A = tables.Table(K)
    A.ensure(0.15, 0.3)
    B = tables.Table(K)
    B.ensure(0.6, 0.6)
    assert sorted(B.panels) == [6, 7, 8] and covers(B.arrays(), [0.13, 0.3, 0.9]).all()


def test_point_leaving_a_table_that_covers_it_goes_to_quadrature(cache, built, bounded, monkeypatch):
    """The progress rule itself, on a table whose packed arrays are forced stale (they lack panel 6, the table
    has it): the point that leaves M inside the table's range goes to the quadrature path with one warning,
    after one extension attempt that builds nothing, never another round (two _extend calls: the first
    layer's guess and that attempt)."""
    T = tables.Table(K)
    T.panels.update({6: built[6], 7: built[7]})
    T.info["mp_checks"] = []
    stale = tables.Table(K)
    stale.panels[7] = built[7]
    monkeypatch.setattr(tables.Table, "arrays", lambda self: tables.pack(stale))
    tables._TABLES[tables.key(K)] = T
    with pytest.warns(RuntimeWarning, match=r"1 point\(s\) left the table of tanh at q = 0\.2386.*which it covers"):
        r = _propagate("table")
    assert r.method == "numba-table+numpy-quadrature" and r.params["points_on_quadrature"] == 1
    assert len(bounded) == 2 and sorted(T.panels) == [6, 7]
    _check(r)


def test_tiny_job_leaving_a_table_finishes_on_quadrature_and_builds_nothing(cache, built, bounded):
    """Ski rental after the first build: a job of a few point-layers (method "auto") that leaves an existing
    table finishes on the quadrature path instead of building panels (x erf(x) at (2, 0) after a c* call
    built 25 octaves, 52 s, for 29 layers of one point). Here q decays from 0.4 below the table (q < 1/8)
    at layer 5 of 8: no extension beyond the first layer's guess, panels {6, 7, 8} untouched, no warning;
    q against mpmath (sf.q_map, dps 15), q12 against the quadrature path."""
    T = tables.Table(K)
    T.panels.update({p: built[p] for p in (6, 7, 8)})
    T.info["mp_checks"] = []
    tables._TABLES[tables.key(K)] = T
    depth = 8
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = sf.propagate("tanh", SW, SB, depth, q0=Q0, qab0=QAB0)
    assert r.method == "numba-table+numpy-quadrature" and r.params["points_on_quadrature"] == 1
    assert len(bounded) == 1 and sorted(T.panels) == [6, 7, 8]
    assert r.status.tolist() == 0
    q = Q0 * SW + SB
    for layer in range(1, depth + 1):
        assert abs(r.q[layer - 1] - q) <= 1e-13 * q, layer
        q = float(sf.q_map("tanh", q, SW, SB, dps=15))
    assert r.q[-1] < 0.125
    ref = sf.propagate("tanh", SW, SB, depth, q0=Q0, qab0=QAB0, method="quadrature")
    np.testing.assert_allclose(r.qab, ref.qab, rtol=1e-13)


def test_status_codes_are_named_once():
    """The status codes have one home (kernels.layout); the recursion and propagate read them by name, and
    propagate's public codes keep their values."""
    L = layout
    assert [L.OK, L.OVERFLOW, L.DOMAIN, L.UNDERFLOW, L.LEFT_TABLE, L.PAUSED] == list(range(6))
    assert (P.OK, P.OVERFLOW, P.DOMAIN, P.UNDERFLOW) == tuple(range(4))
    assert sorted(P.Propagation.STATUS) == [0, 1, 2, 3] and len(P.Propagation.STATUS_NAMES) == 4
    src = codegen.kernel_source(recursion)
    assert "status[i0 + j] = LEFT_TABLE" in src and "status[i0 + j] = PAUSED" in src
    assert not re.search(r"status\[i0 \+ j\] = \d", src)        # no literal codes
