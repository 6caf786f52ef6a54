"""Results to files people load elsewhere: CSV, .npz and netCDF (xarray), parameters inside.

One call, :func:`save`, writes a table of named arrays over named coordinates:

- ``.csv``: a comment line ``# {...}`` (the parameters as JSON), a header, one row per grid point (C
  order); variables over fewer coordinates than the grid go only to .npz/.nc;
- ``.npz``: every coordinate and variable, plus ``params`` (the JSON text);
- ``.nc``: an ``xarray.Dataset`` built by :func:`symfield.core.dataset.build`.

Every file records its provenance (:func:`symfield.core.version.provenance`): argv, UTC time, versions.
:func:`save_result` writes any result object that has ``to_xarray()`` the same way. Values computed at
``dps`` = N are written as text with N significant digits (:func:`mp_text`; ``<name>_mp`` beside the
float64 variable in .npz/.nc). docs/numerics.md section 9.
"""
from __future__ import annotations

from symfield.core.errors import InvalidValue, Unsupported
import csv
import io
import json
import os
from pathlib import Path

import numpy as np

from symfield.core.dataset import build, mp_text, split_mp
from symfield.core.files import atomic_write, replacing, save_npz
from symfield.core.version import __version__, provenance

__all__ = ["SUFFIXES", "writable", "params_record", "mp_text", "save", "save_result", "netcdf_provenance"]

SUFFIXES = (".csv", ".npz", ".nc")


def writable(path, name, suffixes=SUFFIXES) -> Path:
    """Check, before any work, that ``path`` has an accepted suffix and can be written."""
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise InvalidValue(f"{name} must end in one of {', '.join(suffixes)}; got {str(path)!r}")
    if not p.parent.is_dir():
        raise InvalidValue(f"{name}: directory {str(p.parent)!r} does not exist")
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InvalidValue(f"{name}: {str(path)!r} is not writable")
    if p.suffix.lower() == ".nc":
        _xarray()
    return p


def _xarray():
    try:
        import xarray
    except ImportError:
        raise Unsupported("netCDF (.nc) output needs xarray (pip install xarray); use .csv or .npz") from None
    return xarray


def params_record(**params) -> dict:
    """The parameters as stored: JSON-safe values plus the symfield version."""
    return {**{k: _plain(v) for k, v in params.items()}, "symfield": __version__}


def _plain(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def _cell(v, dps):
    if isinstance(v, float):
        return repr(v)
    return str(v) if isinstance(v, (int, str)) else mp_text(v, dps)


def netcdf_provenance(prov: dict) -> dict:
    """Dataset attributes recording ``prov`` (:func:`symfield.core.version.provenance`): ``provenance``
    (JSON text) and the CF attributes ``history`` ("<time>: <argv>") and ``source``."""
    return {"provenance": json.dumps(prov, sort_keys=True),
            "history": f"{prov['time']}: {' '.join(prov['argv'])}",
            "source": f"symfield {prov['versions']['symfield']}"}


def save_result(path, result):
    """Write a result object (anything with ``to_xarray()`` and ``dataset_parts()``) to .csv/.npz/.nc:
    the .nc file opens as ``result.to_xarray()`` plus provenance attributes."""
    parts = result.dataset_parts()
    return save(path, parts["data"], parts["coords"], parts.get("params") or {}, parts.get("dims"),
                parts.get("dps"), var_attrs=parts.get("var_attrs"), phases=parts.get("phases"))


def save(path, data: dict, coords: dict, params: dict, dims: dict | None = None, dps: int | None = None,
         var_attrs: dict | None = None, phases=None):
    """Write ``data`` (name -> array over ``coords``, or over ``dims[name]``) with ``params``;
    mpmath values (object arrays) are written to ``dps`` digits. ``var_attrs`` and ``phases`` go to
    the .nc builder (:func:`symfield.core.dataset.build`). A coordinate given as (dims, values) is
    not a dimension: .npz stores it, CSV leaves it out."""
    dims = dims or {}
    prov = provenance()
    grid = tuple(k for k, v in coords.items() if not isinstance(v, tuple))
    stream = hasattr(path, "write")          # an open text file (e.g. sys.stdout): CSV
    suffix = ".csv" if stream else Path(path).suffix.lower()
    if suffix == ".csv":
        full = [k for k in data if dims.get(k, grid) == grid]
        axes = np.meshgrid(*[np.asarray(coords[c]) for c in grid], indexing="ij")
        cols = [a.ravel().tolist() for a in axes] + [np.asarray(data[k]).ravel().tolist() for k in full]
        fh = path if stream else io.StringIO()
        fh.write(f"# {json.dumps({**params, 'provenance': prov}, sort_keys=True)}\n")
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(list(grid) + full)
        w.writerows([_cell(v, dps) for v in row] for row in zip(*cols))
        if not stream:       # built in memory, then written whole: never a file cut mid-row
            atomic_write(path, fh.getvalue())
        return path
    path = Path(path)
    if suffix == ".npz":
        arrays = {k: np.asarray(v[1] if isinstance(v, tuple) else v) for k, v in coords.items()}
        arrays.update(split_mp(data, dps or 15))
        save_npz(path, {**arrays, "params": np.array(json.dumps(params, sort_keys=True)),
                        "provenance": np.array(json.dumps(prov, sort_keys=True))})
        return path
    _xarray()
    ds = build(data, coords, dims, params, attrs=netcdf_provenance(prov), var_attrs=var_attrs, dps=dps,
               phases=phases)
    with replacing(path) as tmp:
        ds.to_netcdf(tmp)
    return path
