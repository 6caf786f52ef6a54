"""Cached files are used only when this user's symfield wrote them (issue 28, items 1 and 5).

numba's cache files are pickles: a planted one must never be unpickled (a payload that would write a file
proves it did not run), whatever the attacker does to the files and to their record, short of holding the
user's key. Tables signed with this user's key are bound to their file name. The key itself is private,
and a process without a usable one neither trusts nor disturbs the user's cache. Every test has its own
cache and key (SYMFIELD_CACHE, SYMFIELD_KEY_DIR under tmp_path); victims run in new processes; results
are checked against exact relu values or mpmath quadrature (tests/numeric/test_cache_hostile.py).
"""
import hashlib
import json
import pickle
import shutil
import stat

import pytest

from conftest import TOL
from symfield.core import files
from test_cache_hostile import BUILD_1D, QSTAR, RELU, cache_warnings, check_relu, qstar_tanh, relu_module, run  # noqa: F401

COMPILED = RELU.replace("m.V.py_func(M, 2.0)", "m.V(M, 2.0)")     # compiled: numba writes its cache files


@pytest.fixture
def own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMFIELD_KEY_DIR", str(tmp_path / "key"))
    return tmp_path / "key"


def payload(marker):
    """A pickle that writes ``marker`` when it is unpickled."""
    class Planted:
        def __reduce__(self):
            return exec, (f"open({str(marker)!r}, 'w').write('ran')",)
    return pickle.dumps(Planted())


def compiled_relu(tmp_path, monkeypatch):
    """The relu module, compiled once by a victim process; returns (module path, numba's folder)."""
    path = relu_module(tmp_path / "cache", monkeypatch)
    check_relu(run(COMPILED))
    folder = path.parent / "__pycache__"
    assert sorted(folder.glob(path.stem + ".*.nbi")) and (folder / f"{path.stem}.nbsig").exists()
    return path, folder


def one_numba_warning(r, path, why):
    got = cache_warnings(r.stderr)
    assert len(got) == 1 and "numba cache files unusable" in got[0] and str(path) in got[0] and why in got[0], r.stderr


@pytest.mark.parametrize("suffix", ["nbi", "nbc"])
def test_planted_pickle_in_numba_cache_does_not_run(tmp_path, monkeypatch, own_key, suffix):
    """The issue's reproducer: a pickle planted in numba's index (or data) file is refused, not unpickled."""
    path, folder = compiled_relu(tmp_path, monkeypatch)
    marker = tmp_path / "PWNED"
    planted = sorted(folder.glob(f"{path.stem}.*.{suffix}"))
    for f in planted:
        f.write_bytes(payload(marker))
    r = run(COMPILED)
    assert not marker.exists(), "the planted pickle ran"
    check_relu(r)
    one_numba_warning(r, path, "does not match the sha256 recorded for")
    assert all(f.read_bytes() != payload(marker) for f in planted if f.exists())
    r = run(COMPILED)                                 # numba's fresh files are recorded and trusted
    check_relu(r)
    assert not cache_warnings(r.stderr)


def _forge_record(folder, path, attacker_key, monkeypatch):
    """A record listing the planted files' sha256, sealed with a key that is not the user's."""
    names = {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
             for f in folder.glob(path.stem + ".*") if f.suffix in (".nbi", ".nbc")}
    with monkeypatch.context() as mp_:
        mp_.setenv("SYMFIELD_KEY_DIR", str(attacker_key))
        mac = files.seal(json.dumps(names, sort_keys=True).encode(), f"numba {path.stem}")
    (folder / f"{path.stem}.nbsig").write_text(json.dumps({"files": names, "mac": mac}))


RECORD_ATTACKS = {
    "forged": (lambda folder, path, tmp, mp_: _forge_record(folder, path, tmp / "attacker-key", mp_),
               "not authenticated by this user's key"),
    "deleted": (lambda folder, path, tmp, mp_: (folder / f"{path.stem}.nbsig").unlink(),
                "is not in the record sealed with this user's key"),
}


@pytest.mark.parametrize("attack", sorted(RECORD_ATTACKS))
def test_planted_pickle_with_a_forged_or_missing_record_does_not_run(tmp_path, monkeypatch, own_key, attack):
    path, folder = compiled_relu(tmp_path, monkeypatch)
    marker = tmp_path / "PWNED"
    for f in folder.glob(f"{path.stem}.*.nbi"):
        f.write_bytes(payload(marker))
    edit, why = RECORD_ATTACKS[attack]
    edit(folder, path, tmp_path, monkeypatch)
    r = run(COMPILED)
    assert not marker.exists(), "the planted pickle ran"
    check_relu(r)
    one_numba_warning(r, path, why)


def test_numba_cache_in_a_folder_others_can_write_is_not_used(tmp_path, monkeypatch, own_key):
    """Others could swap a file between the check and numba's read: the cache is switched off (one warning)."""
    path, folder = compiled_relu(tmp_path, monkeypatch)
    marker = tmp_path / "PWNED"
    for f in folder.glob(f"{path.stem}.*.nbi"):
        f.write_bytes(payload(marker))
    folder.chmod(0o777)
    try:
        r = run(COMPILED)
    finally:
        folder.chmod(0o700)
    assert not marker.exists(), "the planted pickle ran"
    check_relu(r)
    got = cache_warnings(r.stderr)
    assert len(got) == 1 and "numba cache not used" in got[0] and "writable by group or others" in got[0], r.stderr


# ----------------------------------------------------------------------------- the key
def test_key_is_created_private_on_first_use(tmp_path, monkeypatch, own_key):
    relu_module(tmp_path / "cache", monkeypatch)
    check_relu(run(RELU))
    key = own_key / files.KEY_NAME
    assert stat.S_IMODE(own_key.stat().st_mode) == 0o700 and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.stat().st_size == files.KEY_BYTES
    before = key.read_bytes()
    check_relu(run(RELU))
    assert key.read_bytes() == before                 # reused, not replaced


UNUSABLE_KEYS = {
    "readable_by_others": (lambda key: key.chmod(0o644), "readable or writable by group or others"),
    "wrong_length": (lambda key: key.write_bytes(b"short"), "holds 5 bytes"),
    "folder_is_a_file": (lambda key: (shutil.rmtree(key.parent), key.parent.write_text("x")), "key"),
}


@pytest.mark.parametrize("attack", sorted(UNUSABLE_KEYS))
def test_process_without_a_usable_key_neither_trusts_nor_disturbs_the_cache(tmp_path, monkeypatch, own_key, attack):
    """One warning; a per-process key and cache: the user's files (sealed with the real key) stay as they are."""
    path = relu_module(tmp_path / "cache", monkeypatch)
    check_relu(run(COMPILED))
    cache = tmp_path / "cache" / "codegen"
    before = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    damage, why = UNUSABLE_KEYS[attack]
    damage(own_key / files.KEY_NAME)
    r = run(COMPILED)
    check_relu(r)
    got = cache_warnings(r.stderr)
    assert len(got) == 1 and "no usable key" in got[0] and why in got[0] and "for this process" in got[0], r.stderr
    assert {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()} == before
    assert path.exists()


# ----------------------------------------------------------------------------- tables bound to their names
def test_signed_tables_swapped_under_each_others_names_are_refused(tmp_path, monkeypatch, own_key, qstar_tanh):
    """Both 1-D tables of tanh (V and E[psi'^2]) carry valid seals, each for its own file name: swapped, both
    are refused (one warning each) and rebuilt, and q* is right again."""
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SYMFIELD_SHIPPED", "0")
    assert run(BUILD_1D).returncode == 0
    a, b = sorted((tmp_path / "cache" / "codegen" / "tables1d").glob("t1d_*.npz"))
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    r = run(QSTAR)
    assert r.returncode == 0, r.stderr
    assert abs(float(r.stdout) - qstar_tanh) <= TOL["identity"] * qstar_tanh, (r.stdout, qstar_tanh)
    got = cache_warnings(r.stderr)
    assert len(got) == 2, r.stderr
    for f in (a, b):
        assert sum(str(f) in line and "not authenticated by this user's key" in line for line in got) == 1, r.stderr
        files.load_checked_npz(f)                     # rebuilt and sealed for its own name


def test_cache_location_follows_the_platform(monkeypatch, tmp_path):
    """platformdirs' user cache folder by default (XDG on Linux, ~/Library/Caches on macOS, LOCALAPPDATA on
    Windows), SYMFIELD_CACHE still overriding it."""
    import sys
    from pathlib import Path

    import platformdirs

    from symfield.core import files as fl
    monkeypatch.delenv("SYMFIELD_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fl._configured() == Path(platformdirs.user_cache_dir("symfield", appauthor=False)) / "codegen"
    if sys.platform.startswith("linux"):
        assert fl._configured() == tmp_path / "xdg" / "symfield" / "codegen"
    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda app, appauthor=None: f"/Library/Caches/{app}")
    assert fl.platform_cache() == Path("/Library/Caches/symfield")          # what macOS returns is used as is
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path / "mine"))
    assert fl._configured() == tmp_path / "mine" / "codegen"
