"""The on-disk cache is a hostile disk (symfield/core/files.py, numeric/codegen.py, table1d.py, tables.py).

Every attack is made on a cache of its own (SYMFIELD_CACHE = tmp_path) and the victim runs in a new
process (the modules and tables would already be loaded in this one). A damaged file must never be
used: it is moved aside (<name>.bad-<pid>) with exactly one CacheWarning line naming it, rebuilt, and
the result is checked against an independent oracle (exact values of the relu maps, mpmath quadrature
of the defining integrals). An unwritable cache location falls back to a temporary directory.
The key that seals cached files (core.files.seal) lives in a directory of this module's own
(SYMFIELD_KEY_DIR); attacks that re-seal a file with it model a bug in our own writer (the structure
checks must still catch it), forgeries without it are in tests/numeric/test_cache_trust.py.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import mpmath as mp
import numpy as np
import pytest

from conftest import TOL
from symfield.core.files import arrays_sha256, load_checked_npz, load_npz, save_checked_npz, save_npz
from symfield.numeric import codegen, table1d, tables
from symfield.symbolic.distance import distance
from symfield.symbolic.kernel import kernel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def _own_key(tmp_path_factory):
    """One key for this module (module fixtures build caches with it, tests read them with it)."""
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setenv("SYMFIELD_KEY_DIR", str(tmp_path_factory.mktemp("key")))
        yield


def resealed(path, arrays):
    """Write ``arrays`` with a fresh content hash and seal made with this module's key (a writer's bug)."""
    arrays = {k: v for k, v in arrays.items() if k not in ("sha256", "mac")}
    save_checked_npz(path, arrays)


def run(code):
    """``code`` in a new Python process (environment of this one: SYMFIELD_CACHE set by the test)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONWARNINGS="default"), timeout=600)


def cache_warnings(stderr):
    return [line for line in stderr.splitlines() if "CacheWarning" in line]


def one_warning_per_file(r, files, why):
    """Exactly one CacheWarning line per damaged file, naming it and saying why."""
    got = cache_warnings(r.stderr)
    assert len(got) == len(files), r.stderr
    for f in files:
        assert sum(str(f) in line and why in line for line in got) == 1, (f, r.stderr)
        assert list(f.parent.glob(f.name + ".bad-*")), f"{f} was not moved aside"


# ----------------------------------------------------------------------------- generated modules
RELU = """
    import numpy as np
    from symfield.numeric import codegen
    from symfield.symbolic.kernel import kernel
    m = codegen.load(kernel("relu"))
    M = codegen.no_data()
    print(repr(m.V.py_func(M, 2.0)), repr(m.C.py_func(M, 2.0, 2.0, 0.0)))
"""


def relu_module(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    K = kernel("relu")
    path = codegen.write(K.act.name, K.V, K.C, distance(K))
    assert path.parent == tmp_path / "codegen"
    return path


def check_relu(r):
    """relu: V(q) = q/2 and C(q, q, 0) = q/(2 pi) exactly (docs/theory.md section 3), at q = 2."""
    assert r.returncode == 0, r.stderr
    v, c = map(float, r.stdout.split())
    assert abs(v - 1.0) <= TOL["rounding"] and abs(c - 1 / np.pi) <= TOL["rounding"] / np.pi


def name_matches_content(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()[:20] == path.stem.rpartition("_")[2]


ATTACKS = {
    "append_exit": lambda b: b + b"\nraise SystemExit(7)\n",
    "append_print": lambda b: b + b"\nprint('TAMPERED')\n",
    "truncated": lambda b: b[: len(b) // 2],
    "empty": lambda b: b"",
}


def _some_slow(attacks, keep):
    """A representative subset by default (keep); the other attacks run with -m slow."""
    return [a if a in keep else pytest.param(a, marks=pytest.mark.slow) for a in attacks]


@pytest.mark.parametrize("attack", _some_slow(ATTACKS, ("append_exit", "truncated")))
def test_damaged_module_is_not_executed_and_is_rewritten(tmp_path, monkeypatch, attack):
    path = relu_module(tmp_path, monkeypatch)
    good = path.read_bytes()
    path.write_bytes(ATTACKS[attack](good))
    r = run(RELU)
    assert r.returncode != 7 and "TAMPERED" not in r.stdout
    check_relu(r)
    one_warning_per_file(r, [path], "does not match the sha256 in its name")
    assert path.read_bytes() == good and name_matches_content(path)
    r = run(RELU)                                   # the rewritten file is trusted: no warning
    check_relu(r)
    assert not cache_warnings(r.stderr)


def test_load_path_refuses_a_module_it_cannot_rewrite(tmp_path, monkeypatch):
    path = relu_module(tmp_path, monkeypatch)
    path.write_bytes(path.read_bytes() + b"\nraise SystemExit(7)\n")
    r = run(f"""
        from symfield.numeric import codegen
        try:
            codegen.load_path({str(path)!r})
        except ValueError as err:
            print("refused:", err)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and "does not match the sha256" in r.stdout


def test_tampered_table_module_is_not_executed(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    path = codegen.write_source("tables", codegen.table_module_source())
    good = path.read_bytes()
    path.write_bytes(good + b"\nprint('TAMPERED')\nraise SystemExit(7)\n")
    r = run("""
        from symfield.numeric import codegen
        m = codegen.table_module()
        print(callable(m.recurse) and callable(m.C_many))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]
    one_warning_per_file(r, [path], "does not match the sha256 in its name")
    assert path.read_bytes() == good


def test_garbage_numba_index_is_removed_and_recompiled(tmp_path, monkeypatch):
    path = relu_module(tmp_path, monkeypatch)
    code = RELU.replace("m.V.py_func(M, 2.0)", "m.V(M, 2.0)")    # compiled: numba writes its cache files
    check_relu(run(code))
    index = sorted((path.parent / "__pycache__").glob(path.stem + ".*.nbi"))
    assert index
    for f in index:
        f.write_bytes(b"I12garbage\n")              # numba itself fails with "could not convert string to int"
    r = run(code)
    check_relu(r)
    got = cache_warnings(r.stderr)
    assert len(got) == 1 and "numba cache files unusable" in got[0] and str(path) in got[0], r.stderr
    assert all(f.read_bytes() != b"I12garbage\n" for f in index if f.exists())
    r = run(code)                                   # numba's fresh files are fine
    check_relu(r)
    assert not cache_warnings(r.stderr)


# ----------------------------------------------------------------------------- 1-D tables (q* of tanh)
QSTAR = """
    import symfield as sf
    sf.chi1("tanh", 1.5, 0.1)                    # reads both 1-D tables of tanh (V, E[psi'^2]) where cached
    print(repr(sf.q_star("tanh", 1.5, 0.1)))
"""
# the same, after building tanh's 1-D tables (a single q* is cheaper by quadrature: the engine's ski rental
# would not build them on its own)
BUILD_1D = """
    import symfield as sf
    from symfield.numeric.maps import maps
    M = maps(sf.kernel("tanh"), method="table")
    M.table1d("V"), M.table1d("dpsi2")
    print(repr(sf.q_star("tanh", 1.5, 0.1)))
"""


@pytest.fixture(scope="module")
def qstar_tanh():
    """Oracle: q* = 1.5 E[tanh(sqrt(q*) z)^2] + 0.1 by mpmath quadrature (dps 30) and findroot."""
    with mp.workdps(30):
        E = lambda q: mp.quad(lambda z: mp.tanh(mp.sqrt(q) * z) ** 2 * mp.npdf(z), [-mp.inf, 0, mp.inf])
        return float(mp.findroot(lambda q: 1.5 * E(q) + mp.mpf("0.1") - q, 0.5))


@pytest.fixture(scope="module")
def tanh_1d_cache(tmp_path_factory):
    """A cache holding tanh's certified 1-D tables (V, E[psi'^2]), built once; tests copy it."""
    root = tmp_path_factory.mktemp("tables1d")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(BUILD_1D)], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, SYMFIELD_CACHE=str(root)), timeout=600)
    assert r.returncode == 0, r.stderr
    return root


def _scaled(path):
    z = load_npz(path)
    z["coef"] = z["coef"] * 1.5                      # stored hash no longer matches
    save_npz(path, z)


def _rehashed_bad_shape(path):
    z = load_npz(path)
    z["coef"] = z["coef"][:, :-1]                    # a consistent hash and seal, a shape __call__ cannot use
    resealed(path, z)


def _no_hash(path):
    z = load_npz(path)
    z.pop("sha256")
    save_npz(path, z)


def _rehashed_without_key(path):
    z = load_npz(path)
    z["coef"] = z["coef"] * 1.5                      # the content hash recomputed, the old seal kept
    z.pop("sha256")
    z["sha256"] = np.array(arrays_sha256({k: v for k, v in z.items() if k != "mac"}))
    save_npz(path, z)


def _forged_with_another_key(path, member="coef"):
    """The issue's forgery: coefficients scaled by 1.5 and re-saved with save_checked_npz, by a process
    holding a key that is not this user's (hash and seal consistent, but not made with the user's key)."""
    z = load_npz(path)
    z[member] = z[member] * 1.5
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setenv("SYMFIELD_KEY_DIR", str(path.parents[2] / "attacker-key"))
        resealed(path, z)


NPZ_ATTACKS = {
    "scaled": (_scaled, "does not match its sha256"),
    "bad_shape": (_rehashed_bad_shape, "shapes"),
    "no_hash": (_no_hash, "no content hash"),
    "rehashed_without_key": (_rehashed_without_key, "not authenticated by this user's key"),
    "forged_with_another_key": (_forged_with_another_key, "not authenticated by this user's key"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "BadZipFile"),
    "empty": (lambda p: p.write_bytes(b""), "Error"),
}


@pytest.mark.parametrize("attack", _some_slow(NPZ_ATTACKS, ("scaled", "empty", "forged_with_another_key")))
def test_damaged_1d_tables_are_rebuilt(tmp_path, monkeypatch, tanh_1d_cache, qstar_tanh, attack):
    shutil.copytree(tanh_1d_cache, tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    files = sorted((tmp_path / "codegen" / "tables1d").glob("t1d_*.npz"))
    assert len(files) == 2                           # V and E[psi'^2]
    damage, why = NPZ_ATTACKS[attack]
    for f in files:
        damage(f)
    r = run(QSTAR)
    assert r.returncode == 0, r.stderr
    assert abs(float(r.stdout) - qstar_tanh) <= TOL["identity"] * qstar_tanh, (r.stdout, qstar_tanh)
    one_warning_per_file(r, files, why)
    for f in files:                                  # rebuilt files pass their own check (hash and seal)
        assert load_checked_npz(f)["coef"].shape[1] == table1d.N


def test_intact_1d_tables_are_used_without_warning(tmp_path, monkeypatch, tanh_1d_cache, qstar_tanh):
    shutil.copytree(tanh_1d_cache, tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    before = {f: f.stat().st_mtime_ns for f in (tmp_path / "codegen" / "tables1d").glob("*.npz")}
    r = run(QSTAR)
    assert r.returncode == 0 and not cache_warnings(r.stderr), r.stderr
    assert abs(float(r.stdout) - qstar_tanh) <= TOL["identity"] * qstar_tanh
    assert {f: f.stat().st_mtime_ns for f in before} == before


# ----------------------------------------------------------------------------- 2-D tables (tanh, q in [0.5, 2])
TANH_C = """
    from symfield.numeric import tables
    from symfield.numeric.kernels import table_maps
    tables.build.MP_CHECKS = 0           # the build's own mpmath spot checks: the test compares with mpmath below
    T = tables.table("tanh", 0.9, 1.0)
    print(repr(float(table_maps.C(T.arrays(), 1.0, 1.0, 0.5))), sorted(T.panels) == [8, 9])
"""


@pytest.fixture(scope="module")
def tanh_C_oracle():
    """C(1, 1, c) = E[tanh(u) tanh(v)], corr(u, v) = c = 1/2, by Mehler's formula
    sum_k c^k a_k^2 / k!, a_k = E[tanh(z) He_k(z)] (odd k; mpmath quadrature, dps 20; terms < 1e-20 beyond k = 39)."""
    def a(k):
        def f(z):
            h0, h1 = mp.mpf(1), z
            for j in range(1, k):
                h0, h1 = h1, z * h1 - j * h0
            return mp.tanh(z) * h1 * mp.npdf(z)
        return 2 * mp.quad(f, [0, mp.inf])
    with mp.workdps(20):
        return float(mp.fsum(mp.mpf(0.5) ** k * a(k) ** 2 / mp.factorial(k) for k in range(1, 40, 2)))


@pytest.fixture(scope="module")
def tanh_table_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(TANH_C)], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, SYMFIELD_CACHE=str(root)), timeout=600)
    assert r.returncode == 0, r.stderr
    return root


def _meta_edit(edit, rehash):
    """Edit the metadata; ``rehash``: True with a fresh hash and seal (this module's key), "without_key" with
    a fresh hash and the old seal, False with the old hash and seal."""
    def damage(path):
        import json
        z = load_npz(path)
        meta = json.loads(str(z["meta"]))
        edit(meta, z)
        z["meta"] = np.array(json.dumps(meta, sort_keys=True))
        if rehash == "without_key":           # the content hash recomputed, the old seal kept
            z.pop("sha256")
            z["sha256"] = np.array(arrays_sha256({k: v for k, v in z.items() if k != "mac"}))
            save_npz(path, z)
        elif rehash:
            resealed(path, z)
        else:
            save_npz(path, z)
    return damage


def _zero_cells(meta, z):
    meta["panels"]["8"]["cells"] = []


def _nan_coefficient(meta, z):
    z["c8_0"] = z["c8_0"].copy()
    z["c8_0"][3, 3] = np.nan


def _gap(meta, z):
    meta["panels"]["9"]["cells"][0][1] *= 0.5     # cell 0 no longer meets cell 1


TABLE_ATTACKS = {
    "zero_cells": (_meta_edit(_zero_cells, False), "does not match its sha256"),
    "zero_cells_rehashed": (_meta_edit(_zero_cells, True), "panel 8 cells: none"),
    "zero_cells_rehashed_without_key": (_meta_edit(_zero_cells, "without_key"), "not authenticated by this user's key"),
    "forged_with_another_key": (lambda p: _forged_with_another_key(p, "c8_0"), "not authenticated by this user's key"),
    "nan_rehashed": (_meta_edit(_nan_coefficient, True), "panel 8 cells: coefficients"),
    "gap_rehashed": (_meta_edit(_gap, True), "do not tile"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "BadZipFile"),
    "empty": (lambda p: p.write_bytes(b""), "Error"),
}


@pytest.mark.parametrize("attack", _some_slow(TABLE_ATTACKS, ("zero_cells_rehashed", "forged_with_another_key",
                                                               "truncated")))
def test_damaged_tables_are_rebuilt(tmp_path, monkeypatch, tanh_table_cache, tanh_C_oracle, attack):
    shutil.copytree(tanh_table_cache, tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    files = sorted((tmp_path / "codegen" / "tables").glob("sf_table_tanh_*.npz"))
    assert len(files) == 1
    damage, why = TABLE_ATTACKS[attack]
    damage(files[0])
    r = run(TANH_C)
    assert r.returncode == 0, r.stderr
    c, panels = r.stdout.split()
    assert panels == "True" and abs(float(c) - tanh_C_oracle) <= TOL["table_float64"], (c, tanh_C_oracle)
    one_warning_per_file(r, files, why)
    assert tables.read(files[0], kernel("tanh"), tables.Table) is not None      # the rebuilt file passes every check


@pytest.mark.slow
def test_relu_max2_table_with_zero_cells_is_rebuilt(tmp_path, monkeypatch):
    """The reported case: relu + max2 (homogeneous) with zero cells once indexed past the end of M.
    Oracle: C(1, 1, 0) = (E relu(max(z1, z2)))^2 = (int_0^inf m 2 phi(m) Phi(m) dm)^2 (independent nodes)."""
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    code = """
        import symfield as sf
        from symfield.numeric import tables
        from symfield.numeric.kernels import table_maps
        T = tables.table(sf.activation("relu", pool="max", k=2))
        r = sf.propagate(sf.activation("relu", pool="max", k=2), 2.0, 0.0, 2, q0=1.0, qab0=0.0)
        print(repr(float(table_maps.C(T.arrays(), 1.0, 1.0, 0.0))), repr(float(r.qab[-1])), int(r.status))
    """
    assert run(code).returncode == 0
    path = next((tmp_path / "codegen" / "tables").glob("sf_table_relu_max2_*.npz"))
    _meta_edit(lambda meta, z: meta["panels"]["0"].update(cells=[]), True)(path)
    r = run(code)
    assert r.returncode == 0, r.stderr
    one_warning_per_file(r, [path], "cells: none")
    c, qab, status = r.stdout.split()
    with mp.workdps(20):
        m1 = float(mp.quad(lambda m: 2 * m * mp.npdf(m) * mp.ncdf(m), [0, mp.inf]))
    assert abs(float(c) - m1 ** 2) <= TOL["table_float64"]
    # layer 1: q = 2, qab = 0; layer 2: qab = sigma_w2 C(2, 2, 0) = 2 * 2 C(1, 1, 0) (degree 1)
    assert status == "0" and abs(float(qab) - 4.0 * m1 ** 2) <= 4 * TOL["table_float64"]


# ----------------------------------------------------------------------------- unwritable cache locations
def test_cache_pointing_at_a_file_falls_back_to_a_temporary_directory(tmp_path, monkeypatch, qstar_tanh):
    target = tmp_path / "not_a_directory"
    target.write_text("a file")
    monkeypatch.setenv("SYMFIELD_CACHE", str(target))
    r = run(QSTAR)
    assert r.returncode == 0, r.stderr
    assert abs(float(r.stdout) - qstar_tanh) <= TOL["identity"] * qstar_tanh
    got = cache_warnings(r.stderr)
    assert len(got) == 1 and "cannot be written" in got[0] and str(target) in got[0], r.stderr
    assert target.read_text() == "a file"


def test_read_only_cache_falls_back_to_a_temporary_directory(tmp_path, monkeypatch, qstar_tanh):
    ro = tmp_path / "ro"
    (ro / "codegen").mkdir(parents=True)
    for d in (ro / "codegen", ro):
        d.chmod(0o555)
    if os.geteuid() == 0:    # root ignores permission bits: a location no process may create (sysfs)
        ro = Path("/sys/symfield-cache-test")
        with pytest.raises(OSError):
            (ro / "codegen").mkdir(parents=True)
    monkeypatch.setenv("SYMFIELD_CACHE", str(ro))
    try:
        r = run(QSTAR)
    finally:
        for d in (tmp_path / "ro", tmp_path / "ro" / "codegen"):
            d.chmod(0o755)
    assert r.returncode == 0, r.stderr
    assert abs(float(r.stdout) - qstar_tanh) <= TOL["identity"] * qstar_tanh
    got = cache_warnings(r.stderr)
    assert len(got) == 1 and "cannot be written" in got[0] and str(ro) in got[0], r.stderr
    assert not any((tmp_path / "ro" / "codegen").iterdir())
