"""Symbolic derivations kept on disk (symfield/symbolic/stored.py): reused only when sealed with this user's key
and keyed on what determines them; a file that fails is moved aside and the value derived again."""
import pickle
import time

import pytest
import sympy as sp

from symfield.core import caches, timelimit
from symfield.core.files import CacheWarning, cache_dir
from symfield.symbolic import gaussian as G
from symfield.symbolic.formula import X as x
from symfield.symbolic.stored import stored

CALLS = []


@stored
def _square(e):
    CALLS.append(e)
    return sp.expand((e + 1) ** 2)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(timelimit, "_ran_out", 0)           # no budget has run out in this process (yet)
    monkeypatch.setenv("SYMFIELD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SYMFIELD_KEY_DIR", str(tmp_path / "key"))
    caches.clear()
    CALLS.clear()
    yield
    caches.clear()


def files():
    return sorted((cache_dir() / "derived").glob("square-*.pkl"))


def test_a_value_is_derived_once_and_read_back():
    assert _square(x) == x**2 + 2 * x + 1 and len(CALLS) == 1 and len(files()) == 1
    assert _square(x) == x**2 + 2 * x + 1 and len(CALLS) == 1
    _square(x + 1)                                          # another argument, another file
    assert len(CALLS) == 2 and len(files()) == 2


def test_the_key_holds_the_settings_of_the_derivations(monkeypatch):
    _square(x)
    monkeypatch.setattr(G, "INTEGRATE_SECONDS", 0)          # SymPy's integration off: not the same derivation
    _square(x)
    assert len(CALLS) == 2 and len(files()) == 2


class _Planted:
    def __reduce__(self):
        return (CALLS.append, ("planted code ran",))


@pytest.mark.parametrize("attack", ["damaged", "planted", "truncated"])
def test_a_file_that_fails_its_check_is_not_unpickled(attack):
    _square(x)
    (path,) = files()
    data = path.read_bytes()
    bad = {"damaged": data[:-1] + bytes([data[-1] ^ 1]),
           "planted": data[:65] + pickle.dumps(_Planted()),
           "truncated": data[:30]}[attack]
    path.write_bytes(bad)
    with pytest.warns(CacheWarning, match="unusable cache file"):
        assert _square(x) == x**2 + 2 * x + 1
    assert "planted code ran" not in CALLS and len(CALLS) == 2
    assert list(path.parent.glob(path.name + ".bad-*")) and len(files()) == 1


def test_nothing_is_stored_once_a_budget_has_run_out():
    @stored
    def _fallback(e):
        try:
            timelimit.call_with_time_limit(0.05, lambda: [time.sleep(0.01) for _ in range(500)])
        except timelimit.TimeLimitExceeded:
            return e                                        # the fallback taken for lack of time
        return 2 * e
    assert _fallback(x) == x
    assert _square(x) == x**2 + 2 * x + 1                   # may use what a memo table kept from the fallback
    assert not list((cache_dir() / "derived").glob("*.pkl"))
