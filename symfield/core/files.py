"""Files on disk: the cache location, atomic writes and the one .npz writer.

Every file symfield writes goes to a temporary file in the target's directory and is renamed
into place (os.replace), so a reader -- another process, a resumed run, a user after Ctrl-C --
sees either the old file or the new one, never a partial one. ``.npz`` archives are written
byte-stable: members in sorted order with fixed timestamps, so the same arrays give the same
bytes (sweep chunks, tables and CLI outputs compare by content).
"""
from __future__ import annotations

import io
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    """``$SYMFIELD_CACHE/codegen`` (default ``$XDG_CACHE_HOME/symfield/codegen``, ``~/.cache/...``): generated
    modules; the tables live in its ``tables/`` and ``tables1d/`` subfolders."""
    root = os.environ.get("SYMFIELD_CACHE")
    if root:
        return Path(root).expanduser() / "codegen"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "symfield" / "codegen"


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


def atomic_write(path, data: bytes | str, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and os.replace;
    the temporary file is removed on any failure (including KeyboardInterrupt)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def save_npz(path, arrays: dict, *, compress: bool = True, durable: bool = True) -> Path:
    """The one .npz writer: byte-stable (npz_bytes) and atomic (atomic_write)."""
    return atomic_write(path, npz_bytes(arrays, compress), durable=durable)


def load_npz(path) -> dict:
    """All arrays of an .npz file (no pickles)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
