"""Tables on disk: the cache file of each kernel's table, and the shipped copies (docs/numerics.md section 3).

A table is one npz (JSON metadata and the coefficient arrays) carrying a sha256 of its members, sealed
with the user's key (symfield.core.files.save_checked_npz); it is written atomically, merged with the
panels another process wrote first, and checked (sha256 or MANIFEST.json for shipped files, then
:func:`symfield.numeric.tables.pack.check_structure`) before use: a file that fails is moved aside with
one warning and rebuilt (a shipped one is only warned about).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import sympy as sp

from symfield.core import caches
from symfield.core.errors import InvalidValue
from symfield.core.files import cache_dir, load_checked_npz, locked, quarantine, save_checked_npz, warn
from symfield.core.version import __version__
from symfield.numeric import shipped
from symfield.numeric.tables.build import TAIL
from symfield.numeric.tables.geometry import E0, N_T, N_TH, TABLE_VERSION, Panel
from symfield.numeric.tables.pack import check_structure

_KEYS: dict = caches.memo()


def key(K):
    k = _KEYS.get(K)
    if k is None:
        k = _KEYS[K] = _key_of(K)
    return k


def _key_of(K):
    parts = [f"table v{TABLE_VERSION}", f"symfield {__version__}", f"E0 {E0} NT {N_T} NTH {N_TH} TAIL {TAIL!r}",
             K.act.name, sp.srepr(K.act.expr), str(K.act.pool), str(K.act.k), sp.srepr(K.V), sp.srepr(K.C),
             repr(tuple(K.kinks))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def path_of(K) -> Path:
    """The cache file of K's table (``_c``: files carrying a content hash, core.files.save_checked_npz)."""
    slug = re.sub(r"[^0-9A-Za-z]+", "_", K.act.name).strip("_")[:40] or "act"
    return cache_dir() / "tables" / f"sf_table_{slug}_{key(K)}_c.npz"


def save(T, path=None):
    """Write the table atomically (npz; JSON metadata; a sha256 of the members) to its cache file, or to
    ``path`` (a shipped copy: no merge, no machine paths). Panels from another process that extend T's
    contiguously are merged first (``T.merge``).
    An unwritable cache is warned about; the table still works in this process."""
    ship, path = path is not None, path or path_of(T.K)
    if ship:
        return _write(T, path, ship)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass                                # _write warns about an unwritable cache
    with locked(path):                      # read, merge and write as one step: no other worker's panels lost
        other = read(path, T.K, type(T))
        if other is not None:
            T.merge(other)
        return _write(T, path, ship)


def _write(T, path, ship):
    data = {}
    info = {k: v for k, v in T.info.items() if k not in ("path", "shipped")}   # set when read
    meta = dict(kind=T.kind, degree=T.degree, parity=T.parity, psi0sq=T.psi0sq, V1=T.V1, info=info,
                panels={})
    for p, pn in T.panels.items():
        data[f"v{p}"] = pn.vcoef
        meta["panels"][str(p)] = dict(err=pn.err, cells=[(a, b) for a, b, _ in pn.cells],
                                      rcells=[(a, b) for a, b, _ in pn.rcells])
        for j, (_, _, coef) in enumerate(pn.cells):
            data[f"c{p}_{j}"] = coef
        for j, (_, _, coef) in enumerate(pn.rcells):
            data[f"r{p}_{j}"] = coef
    data["meta"] = np.array(json.dumps(meta, sort_keys=True))
    try:
        save_checked_npz(path, data)
    except OSError as err:
        if ship:
            raise
        warn(f"cannot write the table of {T.name} ({err.strerror or err}); kept in memory only", path)
        return
    if not ship:
        T.info["path"] = str(path)


def ship_name(K) -> str:
    """The file name of K's table among the shipped ones (symfield.numeric.shipped): a hash of what it
    tabulates -- phi's expression, pool, k, kinks and the table parameters -- not of any version."""
    slug = re.sub(r"[^0-9A-Za-z]+", "_", K.act.name).strip("_")[:40] or "act"
    k = shipped.key(f"table v{TABLE_VERSION}", f"E0 {E0} NT {N_T} NTH {N_TH} TAIL {TAIL!r}",
                    sp.srepr(K.act.expr), str(K.act.pool), str(K.act.k), repr(tuple(K.kinks)))
    return f"sf_table_{slug}_{k}.npz"


def shipped_copy(K) -> Path | None:
    """The shipped file of K's table: the one of its own name, else one of another name with the same hash.
    The hash names what is tabulated (phi's expression, pool, k, kinks), the name's slug only the activation,
    so a kernel tabulating the same psi under another name (the q -> inf limit of gelu+max2, whose phi is
    relu's Max(0, x)) reads that table. None when nothing is shipped for it."""
    name = ship_name(K)
    p = shipped.lookup("tables", name)
    if p is None and shipped.enabled():
        same = sorted(shipped.path("tables", "").glob("sf_table_*" + name[name.rindex("_"):]))
        p = same[0] if same else None
    return p


def read(path, K, cls, is_shipped=False):
    """The table (a ``cls``) stored at ``path`` (None if absent). A file that cannot be read, fails its sha256 or
    :func:`check_structure` is moved aside with one warning (None: rebuilt); a shipped one is only
    warned about (the package directory is never written)."""
    if path is None or not path.exists():
        return None
    try:
        z = load_checked_npz(path, shipped.sha256(path) if is_shipped else None)   # shipped: against MANIFEST.json
        meta = json.loads(str(z["meta"]))
        T = cls(K)
        if (meta["kind"], meta["degree"], meta["parity"]) != (T.kind, T.degree, T.parity):
            raise InvalidValue(f"kind/degree/parity {meta['kind']}/{meta['degree']}/{meta['parity']} are not the kernel's")
        T.V1, T.info = meta["V1"], meta["info"]
        for p, d in meta["panels"].items():
            cells = [(a, b, z[f"c{p}_{j}"]) for j, (a, b) in enumerate(d["cells"])]
            rcells = [(a, b, z[f"r{p}_{j}"]) for j, (a, b) in enumerate(d.get("rcells", []))]
            T.panels[int(p)] = Panel(z[f"v{p}"], cells, d["err"], rcells)
        check_structure(T)
    except Exception as err:   # any failure to read or check (BadZipFile, EOFError, KeyError, ...): rebuilt
        if is_shipped:
            warn(f"shipped table ignored ({type(err).__name__}: {err}); building it", path)
        else:
            quarantine(path, f"{type(err).__name__}: {err}")
        return None
    T.info.pop("path", None)     # files written before paths were left out
    T.info["shipped" if is_shipped else "path"] = str(path)
    return T
