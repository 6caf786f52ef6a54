"""Files on disk: the cache location, atomic writes, the one .npz writer and the one authentication helper.

Every file is written to a temporary file beside the target and renamed into place (os.replace), so a
reader sees the old file or the new one, never a partial one; ``.npz`` archives are byte-stable.

The cache is treated as a hostile disk: nothing read from it is parsed into code or objects before
:func:`authenticate` has accepted it -- generated modules and shipped tables by their sha256, cached
tables (:func:`save_checked_npz` / :func:`load_checked_npz`) by a digest and an HMAC under this user's
key (:func:`seal`), numba's cache files by a sealed record of their sha256. Without a usable key, or
a writable cache, the process uses a per-process key and temporary cache (:func:`cache_dir`, one warning).
A file that fails its check is moved aside (:func:`quarantine`, one :class:`CacheWarning`) and rebuilt.

Threat model, key file rules and what is not protected against: docs/numerics.md section 9.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue
import atexit
import hashlib
import hmac
import io
import os
import shutil
import tempfile
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from symfield.core import caches
from symfield.core.errors import CacheError


class CacheWarning(UserWarning):
    """A cached file failed its check (moved aside and rebuilt), or the cache location cannot be written."""


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
    return platform_cache() / "codegen"


def platform_cache() -> Path:
    """The platform's user cache folder for symfield (platformdirs): Linux ``$XDG_CACHE_HOME/symfield``
    (``~/.cache/symfield``), macOS ``~/Library/Caches/symfield``, Windows ``%LOCALAPPDATA%\\symfield\\Cache``;
    the XDG rule when platformdirs is missing. SYMFIELD_CACHE overrides it (:func:`cache_dir`)."""
    try:
        import platformdirs
    except ImportError:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(xdg) / "symfield"
    return Path(platformdirs.user_cache_dir("symfield", appauthor=False))


_USABLE: dict = caches.memo()   # (configured location, key directory) -> the directory used by this process


def cache_dir() -> Path:
    """``$SYMFIELD_CACHE/codegen`` (default :func:`platform_cache`/codegen, e.g. ``~/.cache/symfield/codegen``): generated
    modules; the tables live in its ``tables/`` and ``tables1d/`` subfolders.

    Probed once per process (create it, write and remove a file): a location that cannot be written
    (read-only, SYMFIELD_CACHE naming a file, ...), or a process without a usable key (:func:`seal`), gets a
    per-process temporary directory instead (removed at exit), with one :class:`CacheWarning`."""
    want = _configured()
    got = _USABLE.get((want, _key_dir()))
    if got is None:
        no_key = _key()[1]
        if no_key:
            why = f"no usable key to authenticate cached files ({no_key}); signing with a per-process key"
        else:
            try:
                want.mkdir(parents=True, exist_ok=True)
                fd, probe = tempfile.mkstemp(dir=want, prefix=".probe.", suffix=".tmp")
                os.close(fd)
                os.unlink(probe)
                got = want
            except OSError as err:
                why = f"cache location cannot be written ({err.strerror or err})"
        if got is None:
            tmp = tempfile.mkdtemp(prefix="symfield-cache-")
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            got = Path(tmp) / "codegen"
            got.mkdir()
            warn(f"{why}; using {got} for this process", want)
        _USABLE[(want, _key_dir())] = got
    return got


# ----------------------------------------------------------------------------- authentication
KEY_BYTES = 32
KEY_NAME = "cache.key"
_KEYS: dict = caches.memo()      # key directory -> (key, why it is a per-process key or "")


def _key_dir() -> Path:
    d = os.environ.get("SYMFIELD_KEY_DIR")
    if d:
        return Path(d).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "symfield"


def check_private(st, what: str, forbidden: int = 0o022) -> None:
    """CacheError unless ``st`` (an os.stat result) is owned by this user with none of the ``forbidden``
    mode bits (default: writable by group or others). No-op where there are no owners (Windows)."""
    if not hasattr(os, "geteuid"):
        return
    if st.st_uid != os.geteuid():
        raise CacheError(f"{what} is owned by uid {st.st_uid}, not by this user")
    if st.st_mode & forbidden:
        rule = "readable or writable by group or others" if forbidden & 0o044 else "writable by group or others"
        raise CacheError(f"{what} has mode {st.st_mode & 0o777:04o}: it must not be {rule}")


def _new_key(path: Path) -> None:
    """Write a random key to ``path`` (mode 0600) unless one exists: linked into place, so concurrent
    creators agree on the first one and no reader sees a partial key."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def _read_key(folder: Path) -> bytes:
    """This user's key in ``folder`` (created on first use); OSError or CacheError when it is unusable."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(folder.stat(), f"key directory {folder}")
    path = folder / KEY_NAME
    if not path.exists():
        _new_key(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        check_private(st, f"key file {path}", 0o077)
        key = fh.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise CacheError(f"key file {path} holds {len(key)} bytes, not {KEY_BYTES}")
    return key


def _key() -> tuple:
    """(key, "") from the key file, or (a random per-process key, why the file is unusable)."""
    folder = _key_dir()
    got = _KEYS.get(folder)
    if got is None:
        try:
            got = (_read_key(folder), "")
        except (OSError, CacheError) as err:
            got = (os.urandom(KEY_BYTES), str(err) if isinstance(err, CacheError) else
                   f"{err.filename or folder}: {err.strerror or err}")
        _KEYS[folder] = got
    return got


def seal(data: bytes, purpose: str) -> str:
    """HMAC-SHA256 (hex) of ``data`` under this user's key; ``purpose`` names what is sealed (the file), so
    a seal is valid only for that file."""
    return hmac.new(_key()[0], purpose.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    """Constant-time comparison of two digests (b may be anything an attacker wrote)."""
    return hmac.compare_digest(a.encode(), b.encode("utf-8", "replace"))


def authenticate(data: bytes, purpose: str = "", *, mac=None, sha256=None, where: str = "its recorded sha256") -> None:
    """Accept ``data`` or raise CacheError. With ``sha256`` (a digest, or a >= 20-digit prefix of one, from a
    trusted source -- our own source text, the shipped manifest, a sealed record; ``where`` names it): its
    sha256 must match. Otherwise ``mac`` must be :func:`seal` (data, purpose)."""
    if sha256 is not None:
        want = str(sha256)
        if len(want) < 20 or not _same(hashlib.sha256(data).hexdigest()[:len(want)], want):
            raise CacheError(f"content does not match {where}")
        return
    if mac is None:
        raise CacheError("not authenticated (no mac: written by another program or an older symfield)")
    if not _same(seal(data, purpose), str(mac)):
        raise CacheError("not authenticated by this user's key (forged, or written by another user or key)")


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
def locked(path):
    """Hold an exclusive advisory lock on ``path``.lock for a read-modify-write of ``path`` (fcntl.flock,
    blocking; released on exit or when the process dies). Parallel workers that merge their panels
    into one table file take turns instead of overwriting each other's. Where the lock cannot be
    taken (no fcntl, e.g. Windows; an unwritable folder) the block runs unlocked: the write is still
    atomic, a concurrent merge can only lose panels, which are rebuilt on demand."""
    try:
        import fcntl
        fh = open(f"{os.fspath(path)}.lock", "a")
    except (ImportError, OSError):
        yield False
        return
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield True
    finally:
        fh.close()                     # closing releases the lock


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
    """All arrays of an .npz file or file object (no pickles)."""
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
    """:func:`save_npz` plus the members ``sha256`` = :func:`arrays_sha256` of the others (damage) and
    ``mac`` = :func:`seal` of that digest for this file's name (forgery, :func:`load_checked_npz`)."""
    if "sha256" in arrays or "mac" in arrays:
        raise InvalidValue("save_checked_npz: 'sha256' and 'mac' are reserved for the content hash and its seal")
    digest = arrays_sha256(arrays)
    return save_npz(path, dict(arrays, sha256=np.array(digest), mac=np.array(seal(digest.encode(), _purpose(path)))))


def _purpose(path) -> str:
    return f"npz {Path(path).name}"


def load_checked_npz(path, sha256: str | None = None) -> dict:
    """The arrays of a :func:`save_checked_npz` file, or CacheError: no content hash, a hash that differs,
    no mac or one this user's key did not make. With ``sha256`` (the file's digest in a trusted manifest:
    the shipped tables) the file's bytes are checked against it, before they are parsed, instead of the mac.
    Reading errors (OSError, BadZipFile, EOFError, ValueError, ...) propagate."""
    data = Path(path).read_bytes()
    if sha256 is not None:
        authenticate(data, sha256=sha256, where="the sha256 in its manifest")
    arrays = load_npz(io.BytesIO(data))
    stored, mac = arrays.pop("sha256", None), arrays.pop("mac", None)
    if stored is None:
        raise CacheError("no content hash")
    digest = arrays_sha256(arrays)
    if str(stored) != digest:
        raise CacheError("content does not match its sha256")
    if sha256 is None:
        authenticate(digest.encode(), _purpose(path), mac=None if mac is None else str(mac))
    return arrays
