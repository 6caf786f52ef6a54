"""Files on disk: the cache location, atomic writes and the one .npz writer.

Every file symfield writes goes to a temporary file in the target's directory and is renamed
into place (os.replace), so a reader -- another process, a resumed run, a user after Ctrl-C --
sees either the old file or the new one, never a partial one. ``.npz`` archives are written
byte-stable: members in sorted order with fixed timestamps, so the same arrays give the same
bytes (sweep chunks, tables and CLI outputs compare by content).

The cache is treated as a hostile disk: every cached file carries a content hash that is checked
before use (generated modules: the sha256 in their name; tables: a ``sha256`` member over the other
members, :func:`save_checked_npz` / :func:`load_checked_npz`). A file that fails its check or cannot be
read is moved aside (:func:`quarantine`, one :class:`CacheWarning`) and rebuilt. A cache location that
cannot be written falls back to a per-process temporary directory (:func:`cache_dir`, one warning).
"""
from __future__ import annotations

import atexit
import hashlib
import io
import os
import shutil
import tempfile
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np


class CacheWarning(UserWarning):
    """A cached file failed its check (moved aside and rebuilt), or the cache location cannot be written."""


class CacheError(ValueError):
    """A cached file is unusable (hash mismatch, wrong structure): callers move it aside and rebuild."""


def warn(message: str, where) -> None:
    """One warning line ``<where>:0: CacheWarning: <message>`` (no source line; every occurrence shown)."""
    warnings.warn_explicit(message, CacheWarning, str(where), 0, module=__name__)


def quarantine(path, why: str) -> None:
    """Move a bad cached file aside (``<name>.bad-<pid>``; deleted if renaming fails) with one warning."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.bad-{os.getpid()}")
    try:
        os.replace(path, aside)
        done = f"moved aside to {aside.name}"
    except OSError:
        try:
            path.unlink()
            done = "deleted"
        except OSError:
            done = "left in place (cannot be moved)"
    warn(f"unusable cache file ({why}); {done}, rebuilt", path)


def _configured() -> Path:
    root = os.environ.get("SYMFIELD_CACHE")
    if root:
        return Path(root).expanduser() / "codegen"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "symfield" / "codegen"


_USABLE: dict = {}   # configured location -> the directory used by this process


def cache_dir() -> Path:
    """``$SYMFIELD_CACHE/codegen`` (default ``$XDG_CACHE_HOME/symfield/codegen``, ``~/.cache/...``): generated
    modules; the tables live in its ``tables/`` and ``tables1d/`` subfolders.

    Probed once per process (create it, write and remove a file): a location that cannot be written
    (read-only, SYMFIELD_CACHE naming a file, ...) is replaced by a per-process temporary directory
    (removed at exit), with one :class:`CacheWarning`."""
    want = _configured()
    got = _USABLE.get(want)
    if got is None:
        try:
            want.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=want, prefix=".probe.", suffix=".tmp")
            os.close(fd)
            os.unlink(probe)
            got = want
        except OSError as err:
            tmp = tempfile.mkdtemp(prefix="symfield-cache-")
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            got = Path(tmp) / "codegen"
            got.mkdir()
            warn(f"cache location cannot be written ({err.strerror or err}); using {got} for this process", want)
        _USABLE[want] = got
    return got


def npz_bytes(arrays: dict, compress: bool = True) -> bytes:
    """An .npz archive of ``arrays`` with sorted members and fixed timestamps (same arrays, same bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


@contextmanager
def replacing(path):
    """Yield a temporary path next to ``path`` (same suffix) for any writer that takes a file name
    (our own bytes, xarray's to_netcdf, matplotlib's savefig). On success it gets the mode a plain
    open() would give (not mkstemp's 0600) and is renamed onto ``path`` (os.replace); on any
    exception, KeyboardInterrupt included, it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)  # savefig reads the format from it
    os.close(fd)
    try:
        yield tmp
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path, data: bytes | str, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`replacing`), fsync'd first when ``durable``."""
    with replacing(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
    return Path(path)


def save_npz(path, arrays: dict, *, compress: bool = True, durable: bool = True) -> Path:
    """The one .npz writer: byte-stable (npz_bytes) and atomic (atomic_write)."""
    return atomic_write(path, npz_bytes(arrays, compress), durable=durable)


def load_npz(path) -> dict:
    """All arrays of an .npz file (no pickles)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def arrays_sha256(arrays: dict) -> str:
    """sha256 over the members' names, dtypes, shapes and bytes (sorted by name)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_checked_npz(path, arrays: dict) -> Path:
    """:func:`save_npz` plus a member ``sha256`` = :func:`arrays_sha256` of the others."""
    if "sha256" in arrays:
        raise ValueError("save_checked_npz: 'sha256' is reserved for the content hash")
    return save_npz(path, dict(arrays, sha256=np.array(arrays_sha256(arrays))))


def load_checked_npz(path) -> dict:
    """The arrays of a :func:`save_checked_npz` file; CacheError when the hash is missing or differs
    (reading errors -- OSError, BadZipFile, EOFError, ValueError, ... -- propagate)."""
    arrays = load_npz(path)
    stored = arrays.pop("sha256", None)
    if stored is None:
        raise CacheError("no content hash")
    if str(stored) != arrays_sha256(arrays):
        raise CacheError("content does not match its sha256")
    return arrays
