"""Shipped tables (symfield/data, symfield.numeric.shipped): intact, current, used, and right.

Oracles: the manifest's sha256 against the files' bytes; each shipped table against quadrature of the
defining integral written here from phi alone (mpmath, tests/oracles.py), at seeded random points;
a damaged, edited or unlisted shipped file is refused against the manifest (one warning naming it) and
the table built instead.
"""
import hashlib
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import TOL

from symfield.numeric import shipped, table1d, tables
from symfield.reports.ship_tables import MANIFEST, kernel_of
from symfield.numeric.maps import shipped_1d_name
from test_cache_hostile import qstar_tanh  # noqa: F401  (mpmath oracle of tanh's q*)

MAN = json.loads((shipped.DATA / MANIFEST).read_text())
SPECS = sorted({e["act"] for e in MAN.values()})


def test_manifest_matches_the_files_and_stays_small():
    files = {p.relative_to(shipped.DATA).as_posix() for p in shipped.DATA.rglob("*.npz")}
    assert files == set(MAN), "every shipped file is in the manifest and vice versa"
    for rel, e in MAN.items():
        data = (shipped.DATA / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == e["sha256"], rel
        assert max(e["oracle_errors"].values()) <= 1e-12, (rel, e["oracle_errors"])
    assert sum(e["bytes"] for e in MAN.values()) < 20e6


@pytest.mark.parametrize("spec", SPECS)
def test_shipped_names_are_current(spec):
    """A shipped file whose name no longer matches what the code looks up would be silently unused."""
    K = kernel_of(spec)
    want = {f"tables/{tables.ship_name(K)}"} if any(e["kind"] in ("general", "homogeneous")
                                                     for e in MAN.values() if e["act"] == spec) else set()
    import sympy as sp
    for what, expr in (("V", K.V), ("dpsi2", K.dpsi2)):
        if expr.has(sp.Integral):
            want.add(f"tables1d/{table1d.ship_name(shipped_1d_name(K, what))}")
    got = {rel for rel, e in MAN.items() if e["act"] == spec}
    assert got == want


def _mp_C(phi, q, c):
    from oracles import mp_expect2
    return float(mp_expect2(phi, phi, q, q, c * q, dps=30, degree=4))


@pytest.mark.parametrize("spec", [pytest.param(s, marks=pytest.mark.slow) if s == "gelu" else s
                                  for s in ("tanh", "gelu") if s in SPECS])
def test_shipped_table_is_loaded_and_agrees_with_mpmath(spec, tmp_path, monkeypatch):
    import mpmath as mp
    from oracles import mp_expect1
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    K = kernel_of(spec)
    T = tables.read(shipped.lookup("tables", tables.ship_name(K)), K, tables.Table, is_shipped=True)
    assert T is not None and "shipped" in T.info
    phi = {"tanh": mp.tanh, "gelu": lambda t: t * mp.ncdf(t)}[spec]
    rng = np.random.default_rng(7)
    for q, c in zip(np.exp(rng.uniform(-4, 1.2, 2)), rng.uniform(-0.95, 0.95, 2)):
        q, c = float(q), float(c)
        v = float(mp_expect1(lambda t: phi(t) ** 2, q, dps=20))
        assert abs(T.V(q) - v) <= TOL["table_float64"] * v
        assert abs(T.C(q, q, c * q) - _mp_C(phi, q, c)) <= TOL["table_float64"] * v


@pytest.mark.slow        # ~20 s (builds relu+max2 in a new process); the refused 1-D attacks below stay in the default run
def test_damaged_shipped_table_is_ignored_and_built(tmp_path):
    """A shipped copy that fails its sha256 is warned about once, never rewritten, and the table built."""
    spec = "relu+max2"
    if spec not in SPECS:
        pytest.skip("relu+max2 is not shipped")
    K = kernel_of(spec)
    data = tmp_path / "data" / "tables"
    data.mkdir(parents=True)
    shutil.copy(shipped.DATA / MANIFEST, data.parent / MANIFEST)
    src = shipped.DATA / "tables" / tables.ship_name(K)
    bad = data / src.name
    shutil.copy(src, bad)
    raw = bytearray(bad.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    before = bad.read_bytes()
    code = ("import warnings, math; warnings.simplefilter('always')\n"
            "from symfield.numeric import shipped, tables\n"
            f"shipped.DATA = __import__('pathlib').Path({str(tmp_path / 'data')!r})\n"
            "from symfield.reports.ship_tables import kernel_of\n"
            f"T = tables.table(kernel_of({spec!r}))\n"
            "from symfield.numeric.kernels import table_maps\n"      # plain Python: no numba compilation
            "print('shipped' in T.info, table_maps.C(T.arrays(), 1.0, 1.0, 0.3))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "SYMFIELD_CACHE": str(tmp_path / "cache"),
                            "SYMFIELD_KEY_DIR": str(tmp_path / "key")})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("shipped table ignored") == 1
    assert "does not match the sha256 in its manifest" in r.stderr and str(bad) in r.stderr, r.stderr
    used, C = r.stdout.split()
    assert used == "False"
    # relu+max2 at c = 0.3 (q = 1): E[max(u1,u2) max(v1,v2)] by the float64 argmax decomposition
    from symfield.reports.bench_cold import max2_C
    ref = max2_C(lambda t: np.maximum(t, 0.0), 1.0, 1.0, 0.3)
    assert math.isclose(float(C), ref, rel_tol=0, abs_tol=1e-11)
    assert bad.read_bytes() == before


def _scaled_and_resaved(path, manifest):
    """The issue's forgery: coefficients x 1.5, re-saved with save_checked_npz (hash and seal consistent)."""
    from symfield.core.files import load_npz, save_checked_npz
    z = {k: v for k, v in load_npz(path).items() if k not in ("sha256", "mac")}
    z["coef"] = z["coef"] * 1.5
    save_checked_npz(path, z)


def _unlisted(path, manifest):
    """An extra file the manifest does not list (here: the listed one's entry removed)."""
    entries = json.loads(manifest.read_text())
    del entries[f"{path.parent.name}/{path.name}"]
    manifest.write_text(json.dumps(entries))


SHIPPED_ATTACKS = {"edited": (_scaled_and_resaved, "does not match the sha256 in its manifest"),
                   "unlisted": (_unlisted, "not listed in MANIFEST.json")}


@pytest.mark.parametrize("attack", sorted(SHIPPED_ATTACKS))
def test_edited_or_unlisted_shipped_1d_table_is_refused(tmp_path, attack, qstar_tanh):
    """tanh's shipped table of V, edited (with a consistent content hash) or not in the manifest: refused
    with one warning naming it, never rewritten; the table is built and q* is right (mpmath oracle)."""
    data = tmp_path / "data"
    shutil.copytree(shipped.DATA, data)
    K = kernel_of("tanh")
    target = data / "tables1d" / table1d.ship_name(shipped_1d_name(K, "V"))
    damage, why = SHIPPED_ATTACKS[attack]
    damage(target, data / MANIFEST)
    before = target.read_bytes()
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import pathlib\n"
            "from symfield.numeric import shipped\n"
            f"shipped.DATA = pathlib.Path({str(data)!r})\n"
            "import symfield as sf\n"
            "print(repr(sf.q_star('tanh', 1.5, 0.1)))\n")
    env = {**__import__("os").environ, "SYMFIELD_CACHE": str(tmp_path / "cache"), "SYMFIELD_KEY_DIR": str(tmp_path / "key")}
    env.pop("SYMFIELD_SHIPPED", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert abs(float(r.stdout) - qstar_tanh) <= TOL["identity"] * qstar_tanh, (r.stdout, qstar_tanh)
    got = [line for line in r.stderr.splitlines() if "CacheWarning" in line]
    assert len(got) == 1 and str(target) in got[0] and "shipped 1-D table ignored" in got[0] and why in got[0], r.stderr
    assert target.read_bytes() == before


def test_a_kernel_of_the_same_psi_under_another_name_reads_the_shipped_table(tmp_path, monkeypatch):
    """The q -> inf limit of gelu+max2 is a max-pool of Max(0, x), relu's phi: its table is relu+max2's shipped
    one (found by the hash of what it tabulates), agreeing with the independent float64 argmax quadrature of
    E[relu(max u) relu(max v)] (symfield.reports.bench_cold.max2_C) at q = 1."""
    if "relu+max2" not in SPECS:
        pytest.skip("relu+max2 is not shipped")
    from symfield.reports.bench_cold import max2_C
    from symfield.symbolic.limits import limit_kernel
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path))
    LK = limit_kernel(kernel_of("gelu+max2"))
    path = tables.store.shipped_copy(LK)
    assert path is not None and path.name == tables.ship_name(kernel_of("relu+max2"))
    T = tables.read(path, LK, tables.Table, is_shipped=True)
    assert T is not None and T.kind == "homogeneous"
    from symfield.numeric.kernels import table_maps     # the table's lookups as plain Python (no compile)
    relu = lambda x: np.maximum(x, 0.0)
    for c in (-0.7, 0.1, 0.6, 0.95):
        assert abs(table_maps.C(T.arrays(), 1.0, 1.0, c) - max2_C(relu, 1.0, 1.0, c)) <= 1e-12
