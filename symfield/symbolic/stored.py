"""Symbolic derivations kept on disk, so a new process does not derive again what an earlier one did
(docs/numerics.md section 9).

:func:`stored` wraps a pure function of SymPy expressions, strings, numbers and activations (the kernel maps,
the large-q limits): its value is pickled to ``cache_dir()/derived/<function>-<key>.pkl``, where the key is the
sha256 of everything that determines the value -- the function's name, its arguments (``srepr``), the text of
every module of ``symfield/symbolic`` (the derivations and the functions they print) and of the function's own
module, the settings that change a derivation's result (INTEGRATE_SECONDS <= 0: no SymPy integration) and the
Python, SymPy and mpmath versions. A process in which a time or memory budget has run out stores nothing: a
fallback taken for lack of time (which a faster machine would not take) may be in its values or memo tables.
A pickle runs code when loaded, so the file holds the pickle's seal under the user's key
(core.files.seal, bound to the file's name) and is authenticated before it is unpickled; a file that fails is
moved aside (one CacheWarning) and the value derived again. Only values are stored: a derivation that raises
(over its time budget, SymPy gave up) leaves no file and raises again in the next process.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import pickle
import sys
from pathlib import Path

import mpmath
import sympy as sp

from symfield.core import timelimit
from symfield.core.errors import CacheError
from symfield.core.files import atomic_write, authenticate, cache_dir, quarantine, seal
from symfield.symbolic import gaussian as G


@functools.cache
def _code_version(source: str) -> str:
    """sha256 of the text of symfield/symbolic and of the module ``source`` (the function's own), and of the
    versions of what runs them."""
    h = hashlib.sha256(f"{sys.version_info[:2]} sympy {sp.__version__} mpmath {mpmath.__version__}".encode())
    for f in [*sorted(Path(__file__).parent.glob("*.py")), Path(source)]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _settings() -> str:
    """The settings that change what a derivation returns: INTEGRATE_SECONDS <= 0 switches SymPy's integration
    off. The time and memory budgets do not (a value computed while one ran out is not stored)."""
    return f"INTEGRATE_SECONDS {G.INTEGRATE_SECONDS!r}"


def _token(a) -> str:
    if isinstance(a, sp.Basic):
        return sp.srepr(a)
    if dataclasses.is_dataclass(a):
        return f"{type(a).__qualname__}({', '.join(_token(getattr(a, f.name)) for f in dataclasses.fields(a))})"
    if a is None or isinstance(a, (str, int, float)):
        return repr(a)
    raise TypeError(f"stored: no key for {type(a).__name__}")


def _path(fn, args) -> Path:
    text = "\0".join([_code_version(sys.modules[fn.__module__].__file__), _settings(), fn.__module__, fn.__qualname__, *map(_token, args)])
    return cache_dir() / "derived" / f"{fn.__name__.strip('_')}-{hashlib.sha256(text.encode()).hexdigest()[:40]}.pkl"


def _load(path: Path):
    """The stored value, or KeyError when there is none (a file that fails its check is moved aside)."""
    try:
        data = path.read_bytes()
    except OSError:
        raise KeyError(path) from None
    try:
        authenticate(data[65:], f"derived {path.name}", mac=data[:64].decode("ascii", "replace"))
        return pickle.loads(data[65:])
    except (CacheError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError) as err:
        quarantine(path, f"{type(err).__name__}: {err}")
        raise KeyError(path) from None


def _save(path: Path, value) -> None:
    try:
        body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if b"Dummy" in body:     # a Dummy symbol is equal only to itself in this process: not stored
            return
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, seal(body, f"derived {path.name}").encode() + b"\n" + body, durable=False)
    except (OSError, pickle.PicklingError, TypeError, AttributeError, RecursionError):
        pass                    # not stored: the next process derives it again


def stored(fn):
    """``fn`` with its values kept on disk (module docstring); positional arguments only."""
    @functools.wraps(fn)
    def wrapper(*args):
        path = _path(fn, args)
        try:
            return _load(path)
        except KeyError:
            pass
        value = fn(*args)
        if not timelimit.ran_out():     # no fallback taken for lack of time, now or in a memo table of this process
            _save(path, value)
        return value
    return wrapper
