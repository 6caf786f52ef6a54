"""numba's cache files, checked before numba unpickles them (docs/numerics.md section 2).

numba's own cache (``njit(cache=True)``: an index ``.nbi`` and data ``.nbc`` per function in ``__pycache__``
beside a generated module) consists of pickles, and unpickling runs code, so numba must read none that this
user's symfield did not write. Every dispatcher of a loaded module is guarded (:func:`guard`) before any is
called: the sha256 of every byte numba writes is captured as numba writes it and kept in a record,
``<module>.nbsig``, sealed with the user's key (core.files.seal: an HMAC the attacker cannot make); right
before numba reads a function's files (and before it saves, which reads the index first) each is checked
against the record. A file that is not recorded or differs -- planted, edited, left by an older symfield or
a killed process -- makes all of the module's numba files go (one CacheWarning), and numba compiles afresh.
Checks and writes of one module's files hold a lock (flock). The remaining gap is a swap between the check
and numba's read (microseconds); against other users it is closed by the folder: ``__pycache__`` is 0700
and numba's cache is used only when that folder and its parent are owned by the user and writable by no
one else (else it is switched off for the module, one warning). Not covered: a process that can read the
key or write the package, and a same-user process racing that window.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:      # pragma: no cover (Windows: no cross-process lock)
    fcntl = None

from symfield.core.errors import CacheError, RunError
from symfield.core.files import atomic_write, authenticate, check_private, seal, warn


def _numba_files(path: Path, folder: Path | None = None, base: str | None = None):
    """numba's index (.nbi) and data (.nbc) files in ``folder`` (default: __pycache__ beside the module) of
    the generated module ``path``, or of its one function whose files start with ``base``."""
    folder = path.parent / "__pycache__" if folder is None else folder
    return sorted(f for f in folder.glob(glob.escape(base or path.stem) + ".*") if f.suffix in (".nbi", ".nbc"))


def _record_path(path: Path, folder: Path) -> Path:
    return folder / f"{path.stem}.nbsig"


def purge(path: Path, why, folder: Path | None = None):
    """Remove numba's cache files of one generated module and their record (one warning when ``why`` is given)."""
    folder = path.parent / "__pycache__" if folder is None else folder
    files = _numba_files(path, folder)
    for f in files + [_record_path(path, folder)]:
        try:
            f.unlink()
        except OSError:
            pass
    if why and files:
        warn(f"numba cache files unusable ({why}); removed {len(files)} file(s), recompiled", path)


def _record_bytes(files: dict) -> bytes:
    return json.dumps(files, sort_keys=True).encode()


def _read_record(path: Path, folder: Path) -> dict:
    """{file name: sha256} recorded for the module's numba files ({} if there is no record); CacheError
    unless the record is sealed with this user's key (core.files.seal)."""
    rec = _record_path(path, folder)
    try:
        raw = json.loads(rec.read_bytes())
        files, mac = dict(raw["files"]), raw["mac"]
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError) as err:
        raise CacheError(f"{rec.name} unreadable ({type(err).__name__})") from None
    try:
        authenticate(_record_bytes(files), f"numba {path.stem}", mac=mac)
    except CacheError as err:
        raise CacheError(f"{rec.name} {err}") from None
    return files


def _write_record(path: Path, folder: Path, written: dict) -> None:
    """Add the sha256 of the files numba just wrote to the record (entries of removed files dropped), sealed."""
    try:
        files = _read_record(path, folder)
    except CacheError:
        files = {}       # a bad record: only what was just written is trusted
    files = {n: h for n, h in {**files, **written}.items() if (folder / n).exists()}
    atomic_write(_record_path(path, folder),
                 json.dumps({"files": files, "mac": seal(_record_bytes(files), f"numba {path.stem}")}), durable=False)


def _check_numba(path: Path, folder: Path, base: str) -> None:
    """Before numba reads (unpickles) the files of one function (``base``): each must have the sha256 that the
    sealed record holds for it. Otherwise all the module's numba files are removed, with one warning, and
    numba compiles afresh."""
    files = _numba_files(path, folder, base)
    if not files:
        return
    try:
        record = _read_record(path, folder)
        for f in files:
            if f.name not in record:
                raise CacheError(f"{f.name} is not in the record sealed with this user's key")
            authenticate(f.read_bytes(), sha256=record[f.name], where=f"the sha256 recorded for {f.name}")
    except (CacheError, OSError) as err:
        purge(path, str(err), folder)


_HELD: dict = {}     # lock file -> [threading lock, depth, open file] of this process


@contextmanager
def _locked(lock: Path):
    """An exclusive lock on ``lock`` across processes (flock; none where fcntl is missing), re-entrant in
    this process: no reader checks a file while another process of this user writes it or its record."""
    held = _HELD.setdefault(str(lock), [threading.RLock(), 0, None])
    with held[0]:
        if held[1] == 0 and fcntl is not None:
            held[2] = open(os.open(lock, os.O_RDWR | os.O_CREAT, 0o600), "rb")
            fcntl.flock(held[2].fileno(), fcntl.LOCK_EX)
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
            if held[1] == 0 and held[2] is not None:
                held[2].close()       # releases the flock
                held[2] = None


class _Tee:
    """A file that passes writes through and hashes them (the sha256 of what numba wrote, not of what is on disk later)."""

    def __init__(self, fh):
        self.fh, self.sha = fh, hashlib.sha256()

    def write(self, b):
        self.sha.update(b)
        return self.fh.write(b)


def _private_folder(folder: Path) -> str:
    """'' if numba's cache folder and its parent are owned by this user and writable by nobody else (then no
    other user can swap a file between the check and numba's read), else why not."""
    try:
        for d in (folder, folder.parent):
            check_private(os.stat(d), f"numba cache folder {d}")
    except (OSError, CacheError) as err:
        return str(err)
    return ""


def _guard_one(disp, path: Path) -> str:
    """Route one dispatcher's cache through the check: before numba reads its index or data files
    (load_overload, and save_overload, which reads the index first) they are checked (:func:`_check_numba`);
    the sha256 of every file numba writes is recorded. Returns why its cache was switched off ('' if not)."""
    from numba.core.caching import NullCache

    cache = disp._cache
    if isinstance(cache, NullCache):
        return ""
    try:
        cf = cache._cache_file
        index = Path(cf._index_path)
        open_for_write, load, save = cf._open_for_write, cache.load_overload, cache.save_overload
    except AttributeError:           # not the numba cache layout this guard knows: no cache at all
        cache.disable()
        return "numba's cache layout is not the one symfield checks"
    folder, base = index.parent, index.name[: -len(".nbi")]
    why = _private_folder(folder)
    if why:
        cache.disable()
        return why
    lock, written = folder / f"{path.stem}.lock", {}

    @contextmanager
    def recording(filepath):
        with open_for_write(filepath) as fh:
            tee = _Tee(fh)
            yield tee
        written[os.path.basename(filepath)] = tee.sha.hexdigest()   # after numba renamed it into place

    def checked_load(sig, target_context):
        with _locked(lock):
            _check_numba(path, folder, base)
            return load(sig, target_context)

    def checked_save(sig, data):
        with _locked(lock):
            _check_numba(path, folder, base)
            written.clear()
            try:
                save(sig, data)
            finally:
                if written:
                    _write_record(path, folder, written)

    cf._open_for_write, cache.load_overload, cache.save_overload = recording, checked_load, checked_save
    return ""


def guard(module, path: Path) -> None:
    """:func:`_guard_one` for every numba dispatcher of a generated module, before any of them is called; one
    warning if the cache had to be switched off (compiled code then lives in this process only)."""
    from numba.core.dispatcher import Dispatcher

    off = set()
    for name, obj in vars(module).items():
        if isinstance(obj, Dispatcher):
            if obj.overloads:        # compiled during exec (a signature in the decorator): read before any check
                raise RunError(f"generated module {path}: {name} was compiled at import; symfield's "
                                   f"generated code must compile lazily")
            off.add(_guard_one(obj, path))
    off.discard("")
    if off:
        warn(f"numba cache not used ({'; '.join(sorted(off))}); compiled code is kept in this process only", path)
